package sparkplug

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/edgegate/edgegate/gateway/payload"
)

// TestIdentityBound: a device identity is bound to the first edge node it
// births: its messages in another group are refused while that node is
// online; once it is dead, an NBIRTH elsewhere moves the binding (the old
// node forgotten, as replaced). A publisher without a device identity is
// bound to nothing.
func TestIdentityBound(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.identity = "line1"
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1))
	e.r.reset()
	e.group = "other"
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	e.send(NData, "", byAlias(1, 2))
	if !slices.Equal(e.r.rejects, []payload.Reason{payload.ReasonIdentityBound, payload.ReasonIdentityBound}) || len(e.r.readings) != 0 {
		t.Fatalf("another group while bound: rejects %v, readings %v", e.r.rejects, e.r.readings)
	}
	if st := h.Stats(); st.Nodes != 1 || st.IdentityBound != 2 {
		t.Fatalf("%+v", st)
	}
	// Dead, it may move.
	e.group = "plant"
	e.ndeath(0)
	e.group = "other"
	e.r.reset()
	e.nbirth(def("v", 1, payload.SpDouble, 1))
	st := h.Stats()
	if len(e.r.rejects) != 0 || st.Nodes != 1 || st.NodeList[0].Group != "other" || st.Forgotten["node_replaced"] != 1 {
		t.Fatalf("moving after its death: rejects %v, %+v", e.r.rejects, st)
	}
	if !slices.Equal(e.r.forgotten, []string{"plant/line1", "plant/line1/d1"}) {
		t.Errorf("aggregator devices forgotten: %v", e.r.forgotten)
	}
	// No identity (an admin's bridge): any group.
	a := newEdge(t, h)
	a.group = "third"
	a.nbirth()
	if len(a.r.rejects) != 0 || h.Stats().Nodes != 2 {
		t.Fatalf("unbound publisher refused: %v", a.r.rejects)
	}
	// The binding is in the snapshot.
	h2 := New(Options{})
	if err := h2.Restore(h.AppendSnapshot(nil), 0); err != nil {
		t.Fatal(err)
	}
	e.h, e.group = h2, "plant"
	e.r.reset()
	e.nbirth()
	if !slices.Equal(e.r.rejects, []payload.Reason{payload.ReasonIdentityBound}) {
		t.Fatalf("after a restore: rejects %v", e.r.rejects)
	}
}

// TestDeviceAndTotalBounds: sparkplug.max_devices_per_node and
// sparkplug.max_metrics (all edge nodes) refuse what is over them.
func TestDeviceAndTotalBounds(t *testing.T) {
	h := New(Options{MaxDevicesPerNode: 2, MaxMetrics: 10})
	e := newEdge(t, h)
	e.nbirth(def("v", 1, payload.SpDouble, 1)) // the node, bdSeq, Node Control/Rebirth, v: 4
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1))
	e.send(DBirth, "d2", def("w", 3, payload.SpDouble, 1)) // 8
	e.send(DBirth, "d3", def("w", 4, payload.SpDouble, 1))
	if st := h.Stats(); st.TooManyDevices != 1 || st.Devices != 2 || st.Definitions != 8 {
		t.Fatalf("%+v", st)
	}
	f := newEdge(t, h)
	f.node = "line2"
	f.nbirth(def("v", 1, payload.SpDouble, 1))
	if st := h.Stats(); st.TooManyMetrics != 2 || st.Definitions != 10 {
		t.Fatalf("over max_metrics: %+v, rejects %v", st, f.r.rejects)
	}
	// A death frees its definitions (its devices stay listed, offline).
	e.ndeath(0)
	f.nbirth(def("v", 1, payload.SpDouble, 1))
	if st := h.Stats(); st.TooManyMetrics != 2 || st.Definitions != 7 {
		t.Fatalf("after line1's death: %+v", st)
	}
}

// TestForgetAfter: an edge node dead for ForgetAfter of elapsed time is
// forgotten at the first message or Expire at or past it, and a device
// offline that long in a live node; nothing before.
func TestForgetAfter(t *testing.T) {
	h := New(Options{ForgetAfter: time.Hour})
	e := newEdge(t, h)
	e.nbirth()
	e.send(DBirth, "d1", def("w", 2, payload.SpDouble, 1))
	e.send(DBirth, "d2", def("w", 3, payload.SpDouble, 1))
	f := newEdge(t, h)
	f.node = "line2"
	f.nbirth()
	e.elapsed = time.Minute
	e.send(DDeath, "d2")
	e.ndeath(0)
	if h.Due(time.Hour) || !h.Due(time.Hour+time.Minute) {
		t.Fatal("Due")
	}
	f.elapsed = time.Hour + time.Minute - 1
	f.send(NData, "")
	if h.Stats().Nodes != 2 {
		t.Fatal("forgotten before the horizon")
	}
	h.Expire(time.Hour+time.Minute, &f.r)
	st := h.Stats()
	if st.Nodes != 1 || st.Forgotten["node_dead"] != 1 || st.Definitions != 3 || h.Due(100*time.Hour) {
		t.Fatalf("past the horizon: %+v", st)
	}
	if !slices.Equal(f.r.forgotten, []string{"plant/line1", "plant/line1/d1", "plant/line1/d2"}) {
		t.Errorf("forgotten %v", f.r.forgotten)
	}
	// A device offline in a live node.
	f.send(DBirth, "d9", def("w", 2, payload.SpDouble, 1))
	f.elapsed += time.Minute
	f.send(DDeath, "d9")
	f.r.reset()
	snap := h.AppendSnapshot(nil)
	h2 := New(Options{ForgetAfter: time.Hour})
	if err := h2.Restore(snap, f.elapsed); err != nil || !h2.Due(f.elapsed+time.Hour) || h2.Due(f.elapsed+time.Hour-1) {
		t.Fatalf("restored: %v, due at the horizon %v", err, h2.Due(f.elapsed+time.Hour))
	}
	f.elapsed += time.Hour
	f.send(NData, "")
	if st := h.Stats(); st.Devices != 0 || st.Forgotten["device_silent"] != 1 || !slices.Equal(f.r.forgotten, []string{"plant/line2/d9"}) {
		t.Fatalf("silent device: %+v, forgotten %v", st, f.r.forgotten)
	}
}

// TestRestoreVersion1: a snapshot of version 1 (before the elapsed times
// and bindings) restores, its nodes last heard of at the checkpoint.
func TestRestoreVersion1(t *testing.T) {
	b := []byte{1}
	b = binary.AppendUvarint(b, 1)
	b = appendString(b, "plant")
	b = appendString(b, "line1")
	b = append(b, 0) // offline
	for _, v := range []int64{3, -1, 0, t0.UnixNano()} {
		b = binary.AppendVarint(b, v)
	}
	b = binary.AppendUvarint(b, 1)
	b = appendString(b, "")
	b = append(b, 0)
	b = binary.AppendUvarint(b, 0)
	h := New(Options{ForgetAfter: time.Hour})
	if err := h.Restore(b, 5*time.Hour); err != nil {
		t.Fatal(err)
	}
	if st := h.Stats(); st.Nodes != 1 || st.NodeList[0].BdSeq != 3 || h.Due(6*time.Hour-1) || !h.Due(6*time.Hour) {
		t.Fatalf("%+v", st)
	}
}

// TestCountedRefusals: past the dead letter's items, refusals are counted
// and not made.
func TestCountedRefusals(t *testing.T) {
	h := New(Options{})
	e := newEdge(t, h)
	e.nbirth()
	e.r.full = true
	var ms []payload.SparkplugOut
	for i := range 100 {
		ms = append(ms, byAlias(uint64(1000+i), 1))
	}
	e.send(NData, "", ms...)
	if e.r.counted != 100 || len(e.r.rejects) != 0 || h.Stats().UnknownAliases != 100 || len(e.r.rebirths) != 1 {
		t.Fatalf("counted %d, made %d, rebirths %v", e.r.counted, len(e.r.rejects), e.r.rebirths)
	}
}
