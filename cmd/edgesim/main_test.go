package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a run or verify leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
