package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
)

// BenchmarkRecover measures restart to ready after a crash with a full
// backlog: an outbound queue at the default quota (1 GiB of undelivered
// summaries, about 2.4 million), 100,000 closed windows in the state file,
// and 10 s of journal after the checkpoint at 60,000 readings/s. One
// iteration opens the outbound queue and rebuilds the gateway's state as
// `edgegate run` does before it listens. Also reported: how long a
// checkpoint takes (it holds the aggregator; acknowledgements do not
// wait), with 10,000 windows closed since the one before.
func BenchmarkRecover(b *testing.B) {
	const (
		queueBytes   = 1 << 30
		devices      = 1000
		metrics      = 10
		afterCP      = 600_000 // 10 s at 60k readings/s
		retainWanted = 100_000
	)
	dir := b.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	down := func(context.Context) (bridge.Producer, error) { return nil, errors.New("no kafka") }
	fwdOpts := bridge.Options{Gateway: "bench", SummariesTopic: "s", DeadletterTopic: "d", Dir: filepath.Join(dir, "outbound"),
		MaxBytes: queueBytes, Policy: bridge.DropOldest, Grace: time.Millisecond, Logger: log}
	cfg := configs.Default()
	cfg.Gateway.ID, cfg.Gateway.DataDir = "bench", dir
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.Kafka.Brokers = []string{"127.0.0.1:9"}
	cfg.Aggregate.AllowedLateness = configs.Duration(24 * time.Hour)

	// The backlog: summaries until the queue is at its quota.
	fwd, err := bridge.NewForwarder(fwdOpts, down)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	s := aggregate.Summary{Gateway: "bench", Metric: "temp", Unit: "Cel", Count: 60, Min: 1, Max: 2, Sum: 90, Mean: 1.5, First: 1, Last: 2, Stddev: 0.5}
	for i := 0; fwd.Stats().QueueBytes < queueBytes*9/10; i++ {
		s.Device = "dev-" + strconv.Itoa(i%devices)
		s.WindowStart = start.Add(time.Duration(i/devices) * time.Minute)
		s.WindowEnd = s.WindowStart.Add(time.Minute)
		s.ID = aggregate.SummaryID(s.Gateway, s.Device, s.Metric, s.WindowStart, 0)
		fwd.Summary(s, bridge.Mark{})
	}
	queued := fwd.Stats().Queued
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fwd.Run(ctx) // closes the queue

	// State: a day of readings folded in until 100,000 windows are
	// retained, a checkpoint, then 10 s more that only the journal has.
	fwd, err = bridge.NewForwarder(fwdOpts, down)
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(cfg.GatewayOptions(nil), output.Forwarder(fwd), log, time.Now)
	if err != nil {
		b.Fatal(err)
	}
	var seq uint64
	rec := make([]byte, 0, 128)
	t := start.Add(23 * time.Hour)
	apply := func(n int) {
		for i := range n {
			t = t.Add(time.Second / (devices * metrics / 10))
			topic := fmt.Sprintf("sensors/dev-%d/m%d", i%devices, (i/devices)%metrics)
			rec = journal.AppendPublish(rec[:0], t.UnixNano(), 1, uint16(i), "c", topic, strconv.AppendInt(nil, int64(i%100), 10))
			seq++
			if _, err := g.JournalLog().Append(rec); err != nil {
				b.Fatal(err)
			}
			g.ApplyBatch(seq, [][]byte{rec})
		}
	}
	for storedWindows(b, g) < retainWanted {
		apply(devices * metrics * 60) // a minute of event time
		if err := g.WriteCheckpoint(); err != nil {
			b.Fatal(err)
		}
	}
	apply(devices * metrics)
	cpStart := time.Now()
	if err := g.WriteCheckpoint(); err != nil { // holds the aggregator throughout
		b.Fatal(err)
	}
	cpTook := time.Since(cpStart)
	apply(afterCP)
	if err := g.JournalLog().Sync(); err != nil {
		b.Fatal(err)
	}
	g.CloseFiles()
	fwd.Run(ctx) // the crash: nothing else is closed or flushed

	b.ResetTimer()
	for b.Loop() {
		fwd, err := bridge.NewForwarder(fwdOpts, down)
		if err != nil {
			b.Fatal(err)
		}
		g, err := gateway.New(cfg.GatewayOptions(nil), output.Forwarder(fwd), log, time.Now)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got := g.Replayed(); got != afterCP {
			b.Fatalf("replayed %d events, want %d", got, afterCP)
		}
		if n := storedWindows(b, g); n < retainWanted {
			b.Fatalf("%d windows stored after recovery, want at least %d", n, retainWanted)
		}
		g.CloseFiles()
		fwd.Run(ctx)
		b.StartTimer()
	}
	b.ReportMetric(float64(queued), "queued-summaries")
	b.ReportMetric(float64(cpTook.Microseconds())/1000, "checkpoint-ms")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/restart")
}

func storedWindows(b *testing.B, g *gateway.Gateway) int {
	n, err := g.State().Windows()
	if err != nil {
		b.Fatal(err)
	}
	return n
}
