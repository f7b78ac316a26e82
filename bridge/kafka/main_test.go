package kafka_test

import (
	"os"
	"testing"

	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

func TestMain(m *testing.M) {
	kafka.DisableMetrics()
	os.Exit(m.Run())
}

const (
	summaries = "edge.summaries"
	dead      = "edge.deadletter"
)

var (
	run     = kafkatest.Run
	summary = kafkatest.Summary
)
