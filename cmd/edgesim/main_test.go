package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/edgegate/edgegate/bridge/kafka"
)

// TestMain fails the package if a run or verify leaves a goroutine behind.
func TestMain(m *testing.M) {
	kafka.DisableMetrics() // as main does
	goleak.VerifyTestMain(m)
}
