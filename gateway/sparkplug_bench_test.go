package gateway_test

import (
	"math"
	"testing"
	"time"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/journal"
	"github.com/edgegate/edgegate/gateway/payload"
)

// BenchmarkSparkplugUnknownAliases measures the applier on an NDATA of
// 60,000 aliases no BIRTH defined (one journaled publication, one dead
// letter): what a hostile or broken edge node costs the single applier
// that every publication waits behind.
func BenchmarkSparkplugUnknownAliases(b *testing.B) {
	const aliases = 60_000
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	g, out := benchGatewayWith(b, func() time.Time { return at }, func(c *configs.Config) { c.Sparkplug.Enabled = true })
	defer g.CloseFiles()
	ms := uint64(at.UnixMilli())
	birth := payload.AppendSparkplug(nil, ms, 0, []payload.SparkplugOut{{Name: "bdSeq", Datatype: payload.SpUInt64, Kind: payload.SpLongValue}})
	g.ApplyBatch(1, [][]byte{journal.AppendPublish(nil, at.UnixNano(), 0, 0, "c", "spBv1.0/bench/NBIRTH/node", birth)})
	metrics := make([]payload.SparkplugOut, aliases)
	for i := range metrics {
		metrics[i] = payload.SparkplugOut{Alias: uint64(1000 + i), HasAlias: true, Kind: payload.SpDoubleValue, Bits: math.Float64bits(1)}
	}
	recs := make([][]byte, b.N)
	for i := range b.N {
		body := payload.AppendSparkplug(nil, ms, (i+1)%256, metrics)
		recs[i] = journal.AppendPublish(nil, at.UnixNano(), 0, 0, "c", "spBv1.0/bench/NDATA/node", body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		g.ApplyBatch(uint64(i)+2, recs[i:i+1])
	}
	b.StopTimer()
	if n := out.dead.Load(); n != uint64(b.N) {
		b.Fatalf("%d dead letters of %d publications", n, b.N)
	}
}
