package bridge_test

import (
	"os"
	"testing"

	"github.com/edgegate/edgegate/bridge/kafka"
)

func TestMain(m *testing.M) {
	kafka.DisableMetrics()
	os.Exit(m.Run())
}
