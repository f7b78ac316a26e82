package bridge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	wire "github.com/edgegate/edgegate/bridge/summary"
)

// BenchmarkDrain measures how fast a backlog of b.N summaries drains from
// the outbound queue into kfake, next to a raw sarama idempotent async
// producer writing the same records to the same broker. Compare the
// records/s of the sub-benchmarks side by side (benchstat over -count runs).
func BenchmarkDrain(b *testing.B) {
	_, addrs := kafkatest.Start(b, 3, summaries, dead, offsetsTopic)
	for _, mode := range []string{"raw-sarama", "raw-sarama-transactions", "forwarder-idempotent", "forwarder-exactly-once"} {
		b.Run(mode, func(b *testing.B) {
			switch mode {
			case "raw-sarama":
				rawDrain(b, addrs, "")
				return
			case "raw-sarama-transactions":
				rawDrain(b, addrs, "raw-txn")
				return
			}
			ko := kafka.Options{Brokers: addrs, ClientID: "bench"}
			if mode == "forwarder-exactly-once" {
				ko.TransactionalID, ko.OffsetsTopic, ko.PositionKey = "edgegate-bench", offsetsTopic, "bench"
			}
			f, err := bridge.NewForwarder(bridge.Options{Gateway: "bench", SummariesTopic: summaries, DeadletterTopic: dead,
				Dir: b.TempDir(), MaxBytes: 4 << 30}, kafka.NewConnector(ko))
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				f.Summary(summary(fmt.Sprintf("dev-%03d", i%500), i/500), bridge.Mark{})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			go func() { done <- f.Run(ctx) }()
			// Time the drain from the moment the link is up (connecting and
			// reading the delivered position back are excluded, as making
			// the raw producer is).
			for !f.Stats().LinkUp {
				time.Sleep(100 * time.Microsecond)
			}
			start := time.Now()
			for f.Stats().Delivered < uint64(b.N) {
				time.Sleep(time.Millisecond)
			}
			el := time.Since(start)
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "records/s")
		})
	}
}

// rawDrain sends b.N summaries with a bare sarama async producer, streaming;
// with a transactional id, in transactions of 10,000 records.
func rawDrain(b *testing.B, addrs []string, txnID string) {
	cfg := kafka.SaramaConfig(kafka.Options{ClientID: "raw", TransactionalID: txnID})
	p, err := sarama.NewAsyncProducer(addrs, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	// The records arrive encoded, as the forwarder's do (it encodes at
	// Enqueue, outside the timer); making the sarama messages is timed.
	type rec struct{ key, value []byte }
	recs := make([]rec, b.N)
	for i := range recs {
		s := summary(fmt.Sprintf("dev-%03d", i%500), i/500)
		recs[i] = rec{wire.RecordKey(&s), wire.AppendJSON(nil, &s)}
	}
	b.ResetTimer()
	start := time.Now()
	msgs := make([]*sarama.ProducerMessage, b.N)
	for i, r := range recs {
		msgs[i] = &sarama.ProducerMessage{Topic: summaries, Key: sarama.ByteEncoder(r.key), Value: sarama.ByteEncoder(r.value),
			Headers: []sarama.RecordHeader{{Key: []byte("edgegate-gateway"), Value: []byte("bench")},
				{Key: []byte("edgegate-schema-version"), Value: []byte("1")}, {Key: []byte("content-type"), Value: []byte("application/json")}}}
	}
	if txnID == "" {
		go func() {
			for _, m := range msgs {
				p.Input() <- m
			}
		}()
		for i := 0; i < b.N; i++ {
			select {
			case <-p.Successes():
			case err := <-p.Errors():
				b.Fatal(err)
			}
		}
	} else {
		for len(msgs) > 0 {
			n := min(len(msgs), 10000)
			if err := p.BeginTxn(); err != nil {
				b.Fatal(err)
			}
			go func(batch []*sarama.ProducerMessage) {
				for _, m := range batch {
					p.Input() <- m
				}
			}(msgs[:n])
			for i := 0; i < n; i++ {
				select {
				case <-p.Successes():
				case err := <-p.Errors():
					b.Fatal(err)
				}
			}
			if err := p.CommitTxn(); err != nil {
				b.Fatal(err)
			}
			msgs = msgs[n:]
		}
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "records/s")
}
