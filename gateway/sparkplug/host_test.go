package sparkplug

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/gateway/payload"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

type rec struct {
	readings  []aggregate.Reading
	rejects   []payload.Reason
	rebirths  []string
	forgotten []string
	counted   int  // refusals only counted (Counted)
	full      bool // Counted says true
}

func (r *rec) Reading(x aggregate.Reading) { r.readings = append(r.readings, x) }
func (r *rec) Reject(e *payload.Error)     { r.rejects = append(r.rejects, e.Reason) }
func (r *rec) Rebirth(group, node string)  { r.rebirths = append(r.rebirths, group+"/"+node) }
func (r *rec) reset()                      { *r = rec{} }
func (r *rec) Forget(device string)        { r.forgotten = append(r.forgotten, device) }
func (r *rec) Counted(payload.Reason) bool {
	if r.full {
		r.counted++
	}
	return r.full
}
func ms(t time.Time) uint64                       { return uint64(t.UnixMilli()) }
func dbl(v float64) (payload.SpValueKind, uint64) { return payload.SpDoubleValue, math.Float64bits(v) }

func def(name string, alias uint64, dt uint32, v float64) payload.SparkplugOut {
	m := payload.SparkplugOut{Name: name, Alias: alias, HasAlias: true, Datatype: dt}
	switch dt {
	case payload.SpDouble:
		m.Kind, m.Bits = dbl(v)
	case payload.SpBoolean:
		m.Kind, m.Bits = payload.SpBoolValue, uint64(v)
	default:
		m.Kind, m.Bits = payload.SpLongValue, uint64(int64(v))
	}
	return m
}

func byAlias(alias uint64, v float64) payload.SparkplugOut {
	k, b := dbl(v)
	return payload.SparkplugOut{Alias: alias, HasAlias: true, Kind: k, Bits: b}
}

// edge drives a Host as one edge node would.
type edge struct {
	t     *testing.T
	h     *Host
	group string
	node  string
	seq   int
	bdSeq uint64
	r     rec
	now   time.Time
	// elapsed is the journal's elapsed time; identity the publisher's
	// device-role identity, if it has one.
	elapsed  time.Duration
	identity string
}

func newEdge(t *testing.T, h *Host) *edge {
	return &edge{t: t, h: h, group: "plant", node: "line1", now: t0}
}

func (e *edge) send(typ, device string, metrics ...payload.SparkplugOut) {
	e.t.Helper()
	seq := e.seq
	switch typ {
	case NBirth:
		seq = 0
		e.seq = 1
	case NDeath:
		seq = -1
	default:
		e.seq = (e.seq + 1) % 256
	}
	e.sendSeq(typ, device, seq, metrics...)
}

func (e *edge) sendSeq(typ, device string, seq int, metrics ...payload.SparkplugOut) {
	e.t.Helper()
	topic := Namespace + "/" + e.group + "/" + typ + "/" + e.node
	if device != "" {
		topic += "/" + device
	}
	tp, ok := e.h.Ingests(topic)
	if !ok {
		e.t.Fatalf("host does not ingest %s", topic)
	}
	e.h.Apply(tp, payload.AppendSparkplug(nil, ms(e.now), seq, metrics), Event{Now: e.now, Elapsed: e.elapsed, Identity: e.identity}, &e.r)
}

func (e *edge) nbirth(metrics ...payload.SparkplugOut) {
	e.t.Helper()
	e.send(NBirth, "", append([]payload.SparkplugOut{{Name: "bdSeq", Datatype: payload.SpInt64, Kind: payload.SpLongValue, Bits: e.bdSeq},
		{Name: "Node Control/Rebirth", Datatype: payload.SpBoolean, Kind: payload.SpBoolValue}}, metrics...)...)
}

func (e *edge) ndeath(bdSeq uint64) {
	e.t.Helper()
	e.send(NDeath, "", payload.SparkplugOut{Name: "bdSeq", Datatype: payload.SpInt64, Kind: payload.SpLongValue, Bits: bdSeq})
}

func values(rs []aggregate.Reading) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %s %g @%s", r.Device, r.Metric, r.Value, r.Time.UTC().Format("15:04:05.000")))
	}
	return out
}

func want(t *testing.T, got []aggregate.Reading, w ...string) {
	t.Helper()
	if g := values(got); !reflect.DeepEqual(g, w) && !(len(g) == 0 && len(w) == 0) {
		t.Fatalf("readings\n%q\nwant\n%q", g, w)
	}
}

func TestAliasResolution(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.nbirth(def("Supply/Voltage", 1, payload.SpDouble, 230.5))
	e.send(DBirth, "pump1", def("Motor/Temperature", 2, payload.SpDouble, 40), def("rpm", 3, payload.SpInt16, -3), def("on", 4, payload.SpBoolean, 1),
		payload.SparkplugOut{Name: "label", Alias: 5, HasAlias: true, Datatype: payload.SpString, Kind: payload.SpStringValue})
	want(t, e.r.readings, "plant/line1 Supply/Voltage 230.5 @10:00:00.000",
		"plant/line1/pump1 Motor/Temperature 40 @10:00:00.000", "plant/line1/pump1 rpm -3 @10:00:00.000")
	if len(e.r.rejects) != 0 || len(e.r.rebirths) != 0 {
		t.Fatalf("rejects %v, rebirths %v", e.r.rejects, e.r.rebirths)
	}
	e.r.reset()
	e.now = t0.Add(time.Second)
	ts := ms(t0.Add(500 * time.Millisecond))
	e.send(DData, "pump1", byAlias(2, 41.5), payload.SparkplugOut{Alias: 3, HasAlias: true, Timestamp: ts, Kind: payload.SpIntValue, Bits: 0xFFFF},
		payload.SparkplugOut{Name: "Motor/Temperature", Kind: payload.SpDoubleValue, Bits: math.Float64bits(42)})
	e.send(NData, "", byAlias(1, 231))
	want(t, e.r.readings, "plant/line1/pump1 Motor/Temperature 41.5 @10:00:01.000", "plant/line1/pump1 rpm -1 @10:00:00.500",
		"plant/line1/pump1 Motor/Temperature 42 @10:00:01.000", "plant/line1 Supply/Voltage 231 @10:00:01.000")
	// The node's alias is not the device's, nor the device's the node's.
	e.r.reset()
	e.send(DData, "pump1", byAlias(1, 1))
	e.send(NData, "", byAlias(2, 1))
	want(t, e.r.readings)
	if !reflect.DeepEqual(e.r.rejects, []payload.Reason{payload.ReasonUnknownAlias, payload.ReasonUnknownAlias}) || len(e.r.rebirths) != 1 {
		t.Fatalf("rejects %v, rebirths %v; want two unknown aliases and one rebirth", e.r.rejects, e.r.rebirths)
	}
	st := h.Stats()
	if st.Protocol != 2 || st.NotAggregated != 2 || st.UnknownAliases != 2 || st.Nodes != 1 || st.NodesOnline != 1 || st.Devices != 1 || st.DevicesOnline != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBooleansWhenConfigured(t *testing.T) {
	h := New(Options{Booleans: true, Separator: ":"})
	e := newEdge(t, h)
	e.nbirth(def("alarm", 1, payload.SpBoolean, 1))
	e.send(NData, "", payload.SparkplugOut{Alias: 1, HasAlias: true, Kind: payload.SpBoolValue, Bits: 0})
	want(t, e.r.readings, "plant:line1 alarm 1 @10:00:00.000", "plant:line1 alarm 0 @10:00:00.000")
}

func TestSeqWrapAndGaps(t *testing.T) {
	h := New(Options{RebirthInterval: time.Minute})
	e := newEdge(t, h)
	e.nbirth(def("v", 1, payload.SpDouble, 0))
	for i := 1; i <= 300; i++ { // wraps 255 → 0 once
		e.send(NData, "", byAlias(1, float64(i)))
	}
	if len(e.r.readings) != 301 || len(e.r.rebirths) != 0 || h.Stats().SeqGaps != 0 {
		t.Fatalf("%d readings, rebirths %v, %d gaps after a wrap", len(e.r.readings), e.r.rebirths, h.Stats().SeqGaps)
	}
	// A gap: the message is used, a rebirth asked for.
	e.r.reset()
	e.seq = (e.seq + 3) % 256
	e.send(NData, "", byAlias(1, 1000))
	want(t, e.r.readings, "plant/line1 v 1000 @10:00:00.000")
	if !reflect.DeepEqual(e.r.rebirths, []string{"plant/line1"}) || h.Stats().SeqGaps != 1 {
		t.Fatalf("rebirths %v, gaps %d after a gap", e.r.rebirths, h.Stats().SeqGaps)
	}
	// The next in sequence after the gap is no gap.
	e.send(NData, "", byAlias(1, 1001))
	if h.Stats().SeqGaps != 1 {
		t.Fatalf("gaps %d", h.Stats().SeqGaps)
	}
	// A second gap within the rebirth interval is counted, not asked again.
	e.seq = (e.seq + 7) % 256
	e.send(NData, "", byAlias(1, 1002))
	if st := h.Stats(); len(e.r.rebirths) != 1 || st.SeqGaps != 2 || st.RebirthsHeld != 1 {
		t.Fatalf("rebirths %v, stats %+v", e.r.rebirths, st)
	}
	// After the interval, by event time, it is asked again.
	e.now = e.now.Add(time.Minute)
	e.seq = (e.seq + 1) % 256
	e.send(NData, "", byAlias(1, 1003))
	if len(e.r.rebirths) != 2 {
		t.Fatalf("rebirths %v after the interval", e.r.rebirths)
	}
}

func TestDataBeforeBirth(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.send(NData, "", byAlias(1, 1))
	e.send(DBirth, "d1", def("x", 2, payload.SpDouble, 1))
	if len(e.r.readings) != 0 || !reflect.DeepEqual(e.r.rejects, []payload.Reason{payload.ReasonNoBirth, payload.ReasonNoBirth}) ||
		!reflect.DeepEqual(e.r.rebirths, []string{"plant/line1"}) {
		t.Fatalf("%+v", e.r)
	}
	// A DDATA of a device without DBIRTH, in a node's session.
	e.now = e.now.Add(time.Hour)
	e.r.reset()
	e.nbirth()
	e.send(DData, "d1", byAlias(2, 1))
	if !reflect.DeepEqual(e.r.rejects, []payload.Reason{payload.ReasonNoBirth}) || len(e.r.rebirths) != 1 {
		t.Fatalf("%+v", e.r)
	}
	if st := h.Stats(); st.BeforeBirth != 3 || st.RebirthRequests != 2 || st.RebirthsHeld != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBdSeqMatching(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.bdSeq = 4
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1))
	// The will of an older connection, delivered after this session's
	// NBIRTH: ignored.
	e.ndeath(3)
	if st := h.Stats(); st.NodesOnline != 1 || st.StaleDeaths != 1 || st.DevicesOnline != 1 {
		t.Fatalf("after a stale NDEATH: %+v", st)
	}
	e.send(NData, "", byAlias(1, 2))
	if len(e.r.readings) != 3 {
		t.Fatalf("readings %q", values(e.r.readings))
	}
	e.ndeath(4)
	st := h.Stats()
	if st.NodesOnline != 0 || st.DevicesOnline != 0 || st.Devices != 1 || st.SessionsEnded != 1 {
		t.Fatalf("after the NDEATH of the session: %+v", st)
	}
	if n := st.NodeList[0]; n.Online || n.Devices[0].Online || n.Metrics != 0 {
		t.Fatalf("node %+v", n)
	}
	// Its aliases went with the session.
	e.r.reset()
	e.send(NData, "", byAlias(1, 3))
	if !reflect.DeepEqual(e.r.rejects, []payload.Reason{payload.ReasonNoBirth}) {
		t.Fatalf("rejects %v", e.r.rejects)
	}
	// A second NDEATH of the same session: it is over already.
	e.ndeath(4)
	if st := h.Stats(); st.StaleDeaths != 2 {
		t.Fatalf("stats %+v", st)
	}
	// A new session; the DDEATH of its device.
	e.bdSeq = 5
	e.nbirth()
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1))
	e.send(DDeath, "d1")
	if st := h.Stats(); st.NodesOnline != 1 || st.DevicesOnline != 0 || st.Devices != 1 {
		t.Fatalf("after DDEATH: %+v", st)
	}
}

// TestHistorical: metrics keep their own timestamps, is_historical ones
// are counted.
func TestHistorical(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	e.now = t0.Add(time.Hour)
	old := t0.Add(10 * time.Minute)
	k, b := dbl(5)
	e.send(NData, "", payload.SparkplugOut{Alias: 1, HasAlias: true, Timestamp: ms(old), IsHistorical: true, Kind: k, Bits: b})
	want(t, e.r.readings, "plant/line1 v 1 @10:00:00.000", "plant/line1 v 5 @10:10:00.000")
	if h.Stats().Historical != 1 {
		t.Fatalf("stats %+v", h.Stats())
	}
}

// TestRestartMidSession: a snapshot taken in the middle of a session
// restores the aliases, seq and bdSeq.
func TestRestartMidSession(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.bdSeq = 9
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1), def("x", 3, payload.SpUInt8, 1))
	e.send(DBirth, "d2", def("w", 4, payload.SpDouble, 1))
	e.send(DDeath, "d2")
	snap := h.AppendSnapshot(nil)
	h2 := New(Options{})
	if err := h2.Restore(snap, 0); err != nil {
		t.Fatal(err)
	}
	if again := h2.AppendSnapshot(nil); !bytes.Equal(again, snap) {
		t.Fatalf("snapshot of the restored state differs:\n%x\n%x", again, snap)
	}
	e.h = h2
	e.r.reset()
	e.send(DData, "d1", payload.SparkplugOut{Alias: 3, HasAlias: true, Kind: payload.SpIntValue, Bits: 7}, byAlias(2, 8))
	e.send(NData, "", byAlias(1, 9))
	want(t, e.r.readings, "plant/line1/d1 x 7 @10:00:00.000", "plant/line1/d1 w 8 @10:00:00.000", "plant/line1 v 9 @10:00:00.000")
	if len(e.r.rejects) != 0 || len(e.r.rebirths) != 0 {
		t.Fatalf("rejects %v, rebirths %v: seq or aliases not restored", e.r.rejects, e.r.rebirths)
	}
	e.ndeath(8)
	if h2.Stats().StaleDeaths != 1 {
		t.Fatal("bdSeq not restored")
	}
	if st := h2.Stats(); st.Devices != 2 || st.DevicesOnline != 1 {
		t.Fatalf("devices not restored: %+v", st)
	}
	// Damaged snapshots are errors, and leave the state empty.
	for i := 1; i < len(snap); i++ {
		if err := h2.Restore(snap[:i], 0); err == nil {
			t.Fatalf("a snapshot cut to %d bytes restored", i)
		}
	}
	if h2.Stats().Nodes != 0 {
		t.Fatal("state left after a failed restore")
	}
	if New(Options{}).AppendSnapshot(nil) != nil {
		t.Fatal("an empty host has a snapshot")
	}
}

func TestBounds(t *testing.T) {
	h := New(Options{MaxNodes: 1, MaxMetricsPerNode: 3})
	e := newEdge(t, h)
	e.nbirth(def("a", 1, payload.SpDouble, 1)) // bdSeq, Node Control/Rebirth and a: 3
	e.send(DBirth, "d1", def("b", 2, payload.SpDouble, 1))
	other := newEdge(t, h)
	other.node = "line2"
	other.nbirth()
	if !reflect.DeepEqual(e.r.rejects, []payload.Reason{payload.ReasonTooManyMetrics}) ||
		!reflect.DeepEqual(other.r.rejects, []payload.Reason{payload.ReasonTooManyNodes}) {
		t.Fatalf("rejects %v and %v", e.r.rejects, other.r.rejects)
	}
	if st := h.Stats(); st.TooManyNodes != 1 || st.TooManyMetrics != 1 || st.Nodes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestIngests(t *testing.T) {
	h := New(Options{Groups: []string{"plant"}})
	for topic, ok := range map[string]bool{
		"spBv1.0/plant/NBIRTH/n":      true,
		"spBv1.0/plant/DDATA/n/d":     true,
		"spBv1.0/plant/NDATA/n/d":     false, // a node message with a device level
		"spBv1.0/plant/DDATA/n":       false,
		"spBv1.0/plant/NCMD/n":        false,
		"spBv1.0/plant/DCMD/n/d":      false,
		"spBv1.0/STATE/host":          false,
		"spBv1.0/other/NDATA/n":       false, // not a group served
		"spBv1.0/plant/NDATA/n/d/e":   false,
		"spBv1.0/plant/NDATA/":        false,
		"spBv1.0//NDATA/n":            false,
		"sensors/plant/NDATA":         false,
		"spBv1.0/plant/NDATA/n/extra": false,
	} {
		if _, got := h.Ingests(topic); got != ok {
			t.Errorf("Ingests(%q) = %v, want %v", topic, got, ok)
		}
	}
}

func TestRebirthCommand(t *testing.T) {
	var p payload.SparkplugPayload
	if err := payload.DecodeSparkplug(RebirthCommand(t0), &p); err != nil {
		t.Fatal(err)
	}
	m := p.Metrics[0]
	if len(p.Metrics) != 1 || string(m.Name) != "Node Control/Rebirth" || m.HasAlias || m.Datatype != payload.SpBoolean || m.Kind != payload.SpBoolValue || m.Bits != 1 ||
		p.Timestamp != ms(t0) || p.HasSeq {
		t.Fatalf("%+v", p)
	}
	if got := string(StatePayload(true, t0)); got != `{"online":true,"timestamp":1796032800000}` {
		t.Fatalf("STATE %s", got)
	}
}

// TestNamesAreCopied: the gateway hands Apply topics that alias its
// journal record, which it reuses; the host keeps copies of the names.
func TestNamesAreCopied(t *testing.T) {
	h := New(Options{})
	buf := make([]byte, 0, 64)
	apply := func(topic string, body []byte, r *rec) {
		t.Helper()
		buf = append(buf[:0], topic...)
		tp, ok := h.Ingests(unsafe.String(unsafe.SliceData(buf), len(buf)))
		if !ok {
			t.Fatalf("not ingested: %s", topic)
		}
		h.Apply(tp, body, Event{Now: t0}, r)
		for i := range buf {
			buf[i] = 'x' // the record's bytes are reused
		}
	}
	var r rec
	apply("spBv1.0/g1/NBIRTH/n1", payload.AppendSparkplug(nil, 0, 0, nil), &r)
	apply("spBv1.0/g1/DBIRTH/n1/d1", payload.AppendSparkplug(nil, 0, 1, []payload.SparkplugOut{def("m", 1, payload.SpDouble, 1)}), &r)
	apply("spBv1.0/g1/DBIRTH/n1/d2", payload.AppendSparkplug(nil, 0, 2, []payload.SparkplugOut{def("m", 2, payload.SpDouble, 2)}), &r)
	apply("spBv1.0/g1/DDATA/n1/d1", payload.AppendSparkplug(nil, 0, 3, []payload.SparkplugOut{byAlias(1, 3)}), &r)
	want(t, r.readings, "g1/n1/d1 m 1 @10:00:00.000", "g1/n1/d2 m 2 @10:00:00.000", "g1/n1/d1 m 3 @10:00:00.000")
	st := h.Stats()
	if n := st.NodeList[0]; n.Group != "g1" || n.Node != "n1" || len(n.Devices) != 2 || n.Devices[0].ID != "d1" || n.Devices[1].ID != "d2" {
		t.Fatalf("names changed with the record: %+v", n)
	}
	if snap := h.AppendSnapshot(nil); bytes.Contains(snap, []byte("xx")) {
		t.Fatalf("snapshot holds the reused bytes: %q", snap)
	}
}

// TestLongSeparator: a separator of several characters names devices and
// leaves their aliases resolvable.
func TestLongSeparator(t *testing.T) {
	h := New(Options{Separator: "::"})
	e := newEdge(t, h)
	e.nbirth()
	e.send(DBirth, "d1", def("m", 1, payload.SpDouble, 1))
	e.send(DData, "d1", byAlias(1, 2))
	want(t, e.r.readings, "plant::line1::d1 m 1 @10:00:00.000", "plant::line1::d1 m 2 @10:00:00.000")
}
