package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// truthFixture: devices a and b each send temp readings 1, 2, 3 in the
// windows 10:00, 10:01 and 10:02 (three per window, 20 s apart), all
// acknowledged at QoS 1; plus one malformed publication, which has no
// window.
func truthFixture(t *testing.T) string {
	t.Helper()
	var b bytes.Buffer
	tr := &firmwaresim.Truth{W: &b}
	var sent []firmwaresim.Sent
	for _, dev := range []string{"a", "b"} {
		for w := range 3 {
			for i := range 3 {
				at := t0.Add(time.Duration(w)*time.Minute + time.Duration(i)*20*time.Second)
				sent = append(sent, firmwaresim.Sent{Device: dev, Metric: "temp", Unit: "Cel", Time: at, Value: float64(i + 1 + w),
					QoS: 1, Acked: true, Kind: firmwaresim.KindReading, Topic: "sensors/" + dev + "/temp", SendStart: at, SentAt: at})
			}
		}
	}
	sent = append(sent, firmwaresim.Sent{Device: "a", QoS: 1, Acked: true, Kind: firmwaresim.KindMalformed, Topic: "sensors/a/temp", SendStart: t0, SentAt: t0})
	tr.W = &b
	for _, s := range sent {
		trAdd(tr, s)
	}
	path := filepath.Join(t.TempDir(), "truth.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// trAdd writes one record the way the fleet does.
func trAdd(tr *firmwaresim.Truth, s firmwaresim.Sent) {
	b, _ := json.Marshal(s)
	tr.W.Write(append(b, '\n'))
}

// summary is a correct summary of window w (0, 1, 2) of dev: values
// w+1, w+2, w+3, worked out by hand.
func summary(dev string, w, rev int) map[string]any {
	start := t0.Add(time.Duration(w) * time.Minute)
	v := []float64{float64(w + 1), float64(w + 2), float64(w + 3)}
	mean := (v[0] + v[1] + v[2]) / 3
	return map[string]any{"id": fmt.Sprintf("%s-%d-%d", dev, w, rev), "gateway": "gw", "device": dev, "metric": "temp", "unit": "Cel",
		"window_start": start, "window_end": start.Add(time.Minute), "count": 3, "min": v[0], "max": v[2], "sum": v[0] + v[1] + v[2],
		"mean": mean, "first": v[0], "last": v[2], "stddev": math.Sqrt(2.0 / 3), "revision": rev, "late": 0}
}

// produce writes the records to topic (one partition per device: a on 0,
// b on 1), in order.
func produce(t *testing.T, brokers []string, recs []map[string]any) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, r := range recs {
		v, _ := json.Marshal(r)
		part := int32(0)
		if r["device"] == "b" {
			part = 1
		}
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "edge.summaries", Partition: part, Value: sarama.ByteEncoder(v)}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVerifyFindsEachDefect feeds verify Kafka contents with one planted
// defect each and requires it reported, by kind and window, with exit
// status 1; the faithful contents pass with 0.
func TestVerifyFindsEachDefect(t *testing.T) {
	truth := truthFixture(t)
	good := func() []map[string]any {
		var r []map[string]any
		for w := range 3 {
			r = append(r, summary("a", w, 0), summary("b", w, 0))
		}
		return r
	}
	for _, tc := range []struct {
		name   string
		recs   func() []map[string]any
		status int
		want   []string
	}{
		{"faithful", good, 0, []string{"OK: every window matches", "TOTAL                      18        6        6        0          0       0      0     0         0       0         1         0"}},
		{"missing window", func() []map[string]any { r := good(); return append(r[:2], r[3:]...) }, 1,
			[]string{"a/temp@2026-11-30T10:01:00Z: missing: 3 readings, no summary"}},
		{"wrong count", func() []map[string]any { r := good(); r[4]["count"] = 4; return r }, 1,
			[]string{"a/temp@2026-11-30T10:02:00Z: differs (revision 0): count 4, want 3"}},
		{"wrong last", func() []map[string]any { r := good(); r[0]["last"] = 2.0; return r }, 1,
			[]string{"a/temp@2026-11-30T10:00:00Z: differs (revision 0): last 2, want 3"}},
		{"duplicate", func() []map[string]any { r := good(); return append(r, summary("a", 1, 0)) }, 1,
			[]string{"a/temp@2026-11-30T10:01:00Z: duplicate: summary a-1-0 (revision 0) read more than once"}},
		{"windows reordered", func() []map[string]any { r := good(); r[0], r[2] = r[2], r[0]; return r }, 1,
			[]string{"a/temp@2026-11-30T10:00:00Z: order: first emitted after the window of 2026-11-30T10:01:00Z"}},
		{"revisions reordered", func() []map[string]any {
			r := good()
			bad := summary("a", 2, 0)
			bad["count"], bad["id"] = 1, "a-2-early"
			rev := summary("a", 2, 1)
			return append(r, rev, bad) // revision 0 read after revision 1
		}, 1, []string{"a/temp@2026-11-30T10:02:00Z: order: revision 0 read after revision 1"}},
		{"unexpected window", func() []map[string]any {
			r := good()
			extra := summary("b", 3, 0)
			return append(r, extra)
		}, 1, []string{"b/temp@2026-11-30T10:03:00Z: unexpected: summary b-3-0 with count 3, no reading sent"}},
		{"revision wins", func() []map[string]any {
			r := good()
			stale := summary("b", 2, 0)
			stale["count"], stale["id"] = 2, "b-2-stale"
			r[5] = stale
			return append(r, summary("b", 2, 1)) // the highest revision is right
		}, 0, []string{"OK: every window matches"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, brokers := kafkatest.Start(t, 2, "edge.summaries")
			produce(t, brokers, tc.recs())
			var out, errb bytes.Buffer
			// --idle counts from before the consumer has fetched anything:
			// time for a loaded machine to start reading.
			status := runMain(context.Background(), []string{"verify", "--truth", truth, "--brokers", strings.Join(brokers, ","), "--idle", "2s"}, &out, &errb)
			if status != tc.status {
				t.Errorf("exit status %d, want %d\n%s%s", status, tc.status, out.String(), errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
