package firmwaresim

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgegate/edgegate/gateway/payload"
)

// TestSparkplugEncoding decodes what a simulated edge node sends with the
// gateway's decoder (a test may import it; the package does not): births
// with bdSeq and aliases, DDATA by alias with seq and is_historical, the
// NDEATH, and data by lost aliases marked alias_lost until the next births.
func TestSparkplugEncoding(t *testing.T) {
	d := Device{ID: "n1", Form: FormSparkplug, Metrics: Environmental()}
	sp := newSpState(d)
	sp.bdSeq = 7
	sp.queueBirths()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	var p payload.SparkplugPayload
	decode := func(om outMsg) {
		t.Helper()
		if err := payload.DecodeSparkplug(om.Payload, &p); err != nil {
			t.Fatalf("%s: %v", om.Topic, err)
		}
	}
	nb, db := sp.births[0], sp.births[1]
	sp.encodeBirth(&nb, d.ID, d.Metrics, now)
	decode(nb)
	if nb.Topic != "spBv1.0/sim/NBIRTH/n1" || p.Seq != 0 || len(p.Metrics) != 2 || string(p.Metrics[0].Name) != "bdSeq" || p.Metrics[0].Bits != 7 {
		t.Fatalf("NBIRTH %s %+v", nb.Topic, p)
	}
	sp.encodeBirth(&db, d.ID, d.Metrics, now)
	decode(db)
	if db.Topic != "spBv1.0/sim/DBIRTH/n1/sensor" || p.Seq != 1 || len(p.Metrics) != 3 || string(p.Metrics[1].Name) != "rh" || p.Metrics[1].Alias != 2 ||
		!p.Metrics[1].IsNull || p.Metrics[1].Datatype != payload.SpDouble || !sp.born {
		t.Fatalf("DBIRTH %s %+v", db.Topic, p)
	}
	msgs, sent := Encode(d, now, rand.New(rand.NewPCG(1, 2)))
	om := outMsg{Message: msgs[0], historical: true}
	for _, s := range sent {
		om.sent = append(om.sent, s.Sent)
	}
	sp.encodeData(&om, d.Metrics)
	decode(om)
	m := p.Metrics[2]
	if om.Topic != "spBv1.0/sim/DDATA/n1/sensor" || p.Seq != 2 || len(p.Metrics) != 3 || m.HasName || m.Alias != 3 || !m.IsHistorical ||
		m.Timestamp != uint64(now.UnixMilli()) || math.Float64frombits(m.Bits) != om.sent[2].Value || om.sent[0].Device != "sim/n1/sensor" {
		t.Fatalf("DDATA %s %+v, sent %+v", om.Topic, p, om.sent)
	}
	decode(outMsg{Message: sp.death(d.ID)})
	if p.HasSeq || p.Metrics[0].Bits != 7 {
		t.Fatalf("NDEATH %+v", p)
	}
	sp.loseAliases()
	sp.encodeData(&om, d.Metrics)
	decode(om)
	if p.Metrics[0].Alias != 101 || om.sent[0].Kind != KindAliasLost || om.sent[0].Counted() {
		t.Fatalf("after the alias loss: %+v, %+v", p.Metrics[0], om.sent[0])
	}
	db = outMsg{Message: Message{Topic: "DBIRTH"}}
	sp.encodeBirth(&db, d.ID, d.Metrics, now)
	sp.encodeData(&om, d.Metrics)
	if om.sent[0].Kind != KindReading {
		t.Fatalf("sent again after the births: %+v", om.sent[0])
	}
	// seq wraps at 256.
	sp.seq = 255
	if a, b := sp.next(), sp.next(); a != 255 || b != 0 {
		t.Fatalf("seq %d then %d", a, b)
	}
}
