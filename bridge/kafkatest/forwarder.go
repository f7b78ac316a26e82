package kafkatest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
)

// Run runs f until the returned stop is called, which returns Run's error.
func Run(t testing.TB, f *bridge.Forwarder) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() { defer wg.Done(); err = f.Run(ctx) }()
	return func() error { cancel(); wg.Wait(); return err }
}

// Summary makes dev's summary of one minute (10:minute on 2026-11-30),
// with its deterministic id.
func Summary(dev string, minute int) aggregate.Summary {
	start := time.Date(2026, 11, 30, 10, minute, 0, 0, time.UTC)
	s := aggregate.Summary{Gateway: "gw-1", Device: dev, Metric: "temp", WindowStart: start, WindowEnd: start.Add(time.Minute),
		Count: int64(minute + 1), Min: 1, Max: 2, Sum: 3, Mean: 1.5, First: 1, Last: 2}
	s.ID = aggregate.SummaryID(s.Gateway, s.Device, s.Metric, s.WindowStart, 0)
	return s
}
