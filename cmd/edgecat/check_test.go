package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/bridge/summary"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// sum makes a valid summary of dev's window w (minutes after t0).
func sum(dev string, w, rev int) aggregate.Summary {
	s := aggregate.Summary{Gateway: "gw-1", Device: dev, Metric: "temp", Unit: "Cel", WindowStart: t0.Add(time.Duration(w) * time.Minute),
		WindowEnd: t0.Add(time.Duration(w+1) * time.Minute), Count: int64(1 + rev), Min: 1, Max: 2, Sum: float64(1 + rev), Mean: 1, First: 1, Last: 1, Revision: rev}
	if rev > 0 {
		s.Late = int64(rev)
	}
	s.Mean = s.Sum / float64(s.Count)
	s.ID = summary.ID(s.Gateway, s.Device, s.Metric, s.WindowStart, rev)
	return s
}

// produce writes summaries with the gateway's key and headers; partition
// -1 lets the key choose.
func produce(t testing.TB, brokers []string, partition int32, ss ...aggregate.Summary) {
	t.Helper()
	produceTo(t, brokers, "edge.summaries", partition, ss...)
}

// produceTo is produce to another topic.
func produceTo(t testing.TB, brokers []string, topic string, partition int32, ss ...aggregate.Summary) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	if partition >= 0 {
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
	}
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	for _, s := range ss {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: partition, Key: sarama.ByteEncoder(summary.RecordKey(&s)), Value: sarama.ByteEncoder(summary.AppendJSON(nil, &s)),
			Headers: []sarama.RecordHeader{{Key: []byte("edgegate-gateway"), Value: []byte(s.Gateway)}, {Key: []byte("edgegate-schema-version"), Value: []byte("1")},
				{Key: []byte("content-type"), Value: []byte("application/json")}}})
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

// TestCheckFindsEachDefect plants one defect at a time and requires check
// to report it, and to pass the faithful stream.
func TestCheckFindsEachDefect(t *testing.T) {
	good := func() []aggregate.Summary {
		return []aggregate.Summary{sum("a", 0, 0), sum("a", 1, 0), sum("a", 0, 1), sum("a", 2, 0), sum("b", 0, 0), sum("b", 1, 0)}
	}
	for _, tc := range []struct {
		name   string
		recs   func() []aggregate.Summary
		status int
		want   string
	}{
		{"faithful", good, 0, "OK"},
		{"duplicate", func() []aggregate.Summary { return append(good(), sum("a", 1, 0)) }, 1,
			"gw-1/a/temp@2026-11-30T10:01:00Z revision 0: id " + sum("a", 1, 0).ID + " read 2 times"},
		{"reordered windows", func() []aggregate.Summary {
			r := good()
			r[0], r[1] = r[1], r[0]
			return r
		}, 1, "gw-1/a/temp@2026-11-30T10:00:00Z: first emitted after the window of 2026-11-30T10:01:00Z"},
		{"revision before its predecessor", func() []aggregate.Summary { return append(good(), sum("b", 0, 2), sum("b", 0, 1)) }, 1,
			"gw-1/b/temp@2026-11-30T10:00:00Z: revision 1 read after revision 2"},
		{"gap", func() []aggregate.Summary { r := good(); return append(r[:1], r[2:]...) }, 1,
			"gw-1/a/temp: 1 window(s) missing between 2026-11-30T10:00:00Z and 2026-11-30T10:02:00Z"},
		{"broken revision chain", func() []aggregate.Summary { return append(good(), sum("b", 1, 2)) }, 1,
			"gw-1/b/temp@2026-11-30T10:01:00Z: revisions [0 2]: 1 missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, brokers := kafkatest.Start(t, 1, "edge.summaries")
			produce(t, brokers, 0, tc.recs()...)
			var out, errb bytes.Buffer
			status := runMain(context.Background(), []string{"check", "--brokers", strings.Join(brokers, ","), "--idle", "500ms"}, &out, &errb)
			if status != tc.status || !strings.Contains(out.String(), tc.want) {
				t.Errorf("status %d (want %d), output lacks %q:\n%s%s", status, tc.status, tc.want, out.String(), errb.String())
			}
		})
	}
	t.Run("gaps allowed", func(t *testing.T) {
		_, brokers := kafkatest.Start(t, 1, "edge.summaries")
		r := good()
		produce(t, brokers, 0, append(r[:1], r[2:]...)...)
		var out bytes.Buffer
		if status := runMain(context.Background(), []string{"check", "--brokers", strings.Join(brokers, ","), "--idle", "500ms", "--allow-gaps"}, &out, &out); status != 0 {
			t.Errorf("status %d:\n%s", status, out.String())
		}
	})
	t.Run("not a summary", func(t *testing.T) {
		_, brokers := kafkatest.Start(t, 1, "edge.summaries")
		bad := sum("a", 0, 0)
		bad.ID = "0123"
		produce(t, brokers, 0, sum("b", 0, 0), bad)
		var out bytes.Buffer
		status := runMain(context.Background(), []string{"check", "--brokers", strings.Join(brokers, ","), "--idle", "500ms"}, &out, &out)
		if status != 1 || !strings.Contains(out.String(), `partition 0 offset 1: id "0123" is not the id`) {
			t.Errorf("status %d:\n%s", status, out.String())
		}
	})
}

// TestTail prints the summaries of one device from the beginning, as a
// table and as JSON lines.
func TestTail(t *testing.T) {
	_, brokers := kafkatest.Start(t, 2, "edge.summaries")
	produce(t, brokers, -1, sum("a", 0, 0), sum("b", 0, 0), sum("a", 1, 0), sum("b", 1, 0), sum("a", 0, 1))
	var out bytes.Buffer
	if status := runMain(context.Background(), []string{"tail", "--brokers", strings.Join(brokers, ","), "--from", "beginning", "--device", "a", "--json", "--to-end"}, &out, &out); status != 0 {
		t.Fatalf("status %d: %s", status, out.String())
	}
	var want bytes.Buffer
	for _, s := range []aggregate.Summary{sum("a", 0, 0), sum("a", 1, 0), sum("a", 0, 1)} {
		want.Write(append(summary.AppendJSON(nil, &s), '\n'))
	}
	if out.String() != want.String() {
		t.Errorf("tail --json:\n%s\nwant\n%s", out.String(), want.String())
	}
	out.Reset()
	if status := runMain(context.Background(), []string{"tail", "--brokers", strings.Join(brokers, ","), "--from", "beginning", "--max", "2", "--metric", "te*"}, &out, &out); status != 0 {
		t.Fatalf("status %d: %s", status, out.String())
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 3 || !strings.Contains(lines[0], "window") || !strings.Contains(lines[1], "2026-11-30T10:0") {
		t.Errorf("tail table:\n%s", out.String())
	}
	// --from a time: records written from then on (by record time).
	for from, want := range map[string]int{time.Now().Add(-time.Hour).Format(time.RFC3339): 5, time.Now().Add(time.Hour).Format(time.RFC3339): 0} {
		out.Reset()
		if status := runMain(context.Background(), []string{"tail", "--brokers", strings.Join(brokers, ","), "--from", from, "--json", "--to-end"}, &out, &out); status != 0 {
			t.Fatalf("status %d: %s", status, out.String())
		}
		if n := strings.Count(out.String(), "\n"); n != want {
			t.Errorf("--from %s: %d summaries, want %d:\n%s", from, n, want, out.String())
		}
	}
	if status := runMain(context.Background(), []string{"tail", "--brokers", strings.Join(brokers, ","), "--from", "yesterday"}, &out, &out); status != 2 {
		t.Errorf("--from yesterday: status %d, want 2", status)
	}
}

// TestLag: lag per partition is the end offset minus the group's
// committed offset (everything, when nothing is committed), and the
// gateway's freshness is the age of its newest window.
func TestLag(t *testing.T) {
	_, brokers := kafkatest.Start(t, 2, "edge.summaries")
	var ss []aggregate.Summary
	for w := range 4 {
		ss = append(ss, sum("a", w, 0))
	}
	produce(t, brokers, 0, ss...)
	produce(t, brokers, 1, sum("b", 0, 0), sum("b", 1, 0))
	// The group has consumed 3 of partition 0 and nothing of partition 1:
	// a member that marks that and leaves.
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cg, err := sarama.NewConsumerGroup(brokers, "dashboards", cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cg.Consume(ctx, []string{"edge.summaries"}, markThree{}); err != nil {
		t.Fatal(err)
	}
	cg.Close()
	var out bytes.Buffer
	if status := runMain(context.Background(), []string{"lag", "--brokers", strings.Join(brokers, ","), "--group", "dashboards"}, &out, &out); status != 0 {
		t.Fatalf("status %d: %s", status, out.String())
	}
	for _, want := range []string{
		"        0            3            4          1\n",
		"        1         none            2          2\n",
		"    total                                    3\n",
		"gw-1                 2026-11-30T10:04:00Z",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lag output lacks %q:\n%s", want, out.String())
		}
	}
}

// markThree marks offset 3 of partition 0, commits and ends the session.
type markThree struct{}

func (markThree) Setup(sess sarama.ConsumerGroupSession) error {
	sess.MarkOffset("edge.summaries", 0, 3, "")
	sess.Commit()
	return nil
}
func (markThree) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (markThree) ConsumeClaim(sarama.ConsumerGroupSession, sarama.ConsumerGroupClaim) error {
	return nil // returning ends the session
}
