package gateway_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/journal"
)

// badPayload fills a payload of mqtt.max_payload_bytes with refused
// items: open, then item repeated with sep between them, then close.
func badPayload(open, item, sep, close string, max int) ([]byte, int) {
	var b bytes.Buffer
	b.WriteString(open)
	n := 0
	for b.Len()+len(sep)+len(item)+len(close) <= max {
		if n > 0 {
			b.WriteString(sep)
		}
		b.WriteString(item)
		n++
	}
	b.WriteString(close)
	return b.Bytes(), n
}

// BenchmarkBadItems measures the applier on one publication of
// mqtt.max_payload_bytes that is all refused items: a JSON object of
// non-numeric fields, a SenML pack of records without a name. One
// journaled publication, one dead letter, thousands of items: what a
// broken or hostile client costs the single applier that every
// publication (and its PUBACK) waits behind.
func BenchmarkBadItems(b *testing.B) {
	max := configs.Default().MQTT.MaxPayload
	cases := map[string]struct{ topic, open, item, close string }{
		"object": {"sensors/dev-bad", "{", `"m":""`, "}"},
		"senml":  {"sensors/dev-bad", "[", "{}", "]"},
	}
	for name, c := range cases {
		b.Run(name, func(b *testing.B) {
			at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
			g, out := benchGateway(b, func() time.Time { return at })
			defer g.CloseFiles()
			body, items := badPayload(c.open, c.item, ",", c.close, int(max))
			rec := journal.AppendPublish(nil, at.UnixNano(), 0, 0, "c", c.topic, body)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			i := 0
			for b.Loop() {
				i++
				g.ApplyBatch(uint64(i), [][]byte{rec})
			}
			b.StopTimer()
			if n := out.dead.Load(); n != uint64(i) {
				b.Fatalf("%d dead letters of %d publications (%s)", n, i, out.first)
			}
			b.ReportMetric(float64(items), "items/op")
		})
	}
}
