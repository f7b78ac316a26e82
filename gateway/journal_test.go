package gateway

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

func TestEventRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  []byte
		want event
	}{
		{"publish", appendPublish(nil, -5, 1|flagDup, 65535, "dev-1", "sensors/dev-1/t", []byte("21.5")),
			event{kind: evPublish, at: -5, flags: 1 | flagDup, pid: 65535, client: []byte("dev-1"), topic: []byte("sensors/dev-1/t"), payload: []byte("21.5")}},
		{"publish empty payload", appendPublish(nil, 7, 0, 0, "", "t", nil),
			event{kind: evPublish, at: 7, client: []byte{}, topic: []byte("t"), payload: []byte{}}},
		{"tick", appendClock(nil, evTick, 1e18), event{kind: evTick, at: 1e18}},
		{"flush", appendClock(nil, evFlush, 3), event{kind: evFlush, at: 3}},
		{"session start", appendSessionStart(nil, 9, "c", session{proto: 5, expiry: 3600, username: "u", listener: "tcp"}),
			event{kind: evSessionStart, at: 9, client: []byte("c"), sess: session{proto: 5, expiry: 3600, username: "u", listener: "tcp"}}},
		{"session end", appendSessionEnd(nil, 9, "c"), event{kind: evSessionEnd, at: 9, client: []byte("c")}},
		{"pubrel", appendPubrel(nil, 9, "c", 513), event{kind: evPubrel, at: 9, client: []byte("c"), pid: 513}},
		{"subscribe", appendSubscribe(nil, 9, "c", "a/#", subscription{qos: 2, retainHandling: 1, noLocal: true, identifier: 7}),
			event{kind: evSubscribe, at: 9, client: []byte("c"), topic: []byte("a/#"), sub: subscription{qos: 2, retainHandling: 1, noLocal: true, identifier: 7}}},
		{"unsubscribe", appendUnsubscribe(nil, 9, "c", "a/#"), event{kind: evUnsubscribe, at: 9, client: []byte("c"), topic: []byte("a/#")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeEvent(tc.rec)
			if err != nil {
				t.Fatal(err)
			}
			norm := func(e event) event { // nil and empty slices alike
				for _, p := range []*[]byte{&e.client, &e.topic, &e.payload} {
					if len(*p) == 0 {
						*p = nil
					}
				}
				return e
			}
			if !reflect.DeepEqual(norm(got), norm(tc.want)) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			// Every strict prefix of a record without a free-length tail
			// is refused.
			if tc.want.kind != evPublish {
				for n := range len(tc.rec) {
					if _, err := decodeEvent(tc.rec[:n]); err == nil {
						t.Errorf("prefix of %d bytes decoded", n)
					}
				}
			}
		})
	}
	for _, bad := range [][]byte{nil, {'X', 0}, {evTick}, append(appendClock(nil, evTick, 1), 0)} {
		if _, err := decodeEvent(bad); !errors.Is(err, errEvent) {
			t.Errorf("decodeEvent(%q) = %v, want errEvent", bad, err)
		}
	}
}

func TestDedupe(t *testing.T) {
	d := newDedupe(3, 2)
	h := func(s string) uint64 { return contentHash([]byte("t"), []byte(s)) }
	d.add([]byte("a"), 1, h("x"), 1)
	d.add([]byte("a"), 2, h("y"), 2)
	if !d.seen([]byte("a"), 1, h("x")) || d.seen([]byte("a"), 1, h("y")) || d.seen([]byte("b"), 1, h("x")) {
		t.Fatal("lookup by client, packet id and content")
	}
	if contentHash([]byte("ab"), []byte("c")) == contentHash([]byte("a"), []byte("bc")) {
		t.Error("topic/payload boundary not in the hash")
	}
	d.add([]byte("a"), 3, h("z"), 3)
	d.add([]byte("a"), 4, h("w"), 4) // ring of 3: pid 1 falls out
	if d.seen([]byte("a"), 1, h("x")) || !d.seen([]byte("a"), 2, h("y")) || !d.seen([]byte("a"), 4, h("w")) {
		t.Error("ring keeps the latest 3")
	}
	d.add([]byte("b"), 1, h("x"), 5)
	d.add([]byte("c"), 1, h("x"), 6) // 2 rings at most: a (used at 4) goes
	if _, ok := d.rings["a"]; ok || len(d.rings) != 2 {
		t.Errorf("rings %v: the least recently used should be evicted", d.rings)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	d := newDedupe(2, 10)
	d.add([]byte("a"), 1, 11, 1)
	d.add([]byte("a"), 2, 22, 2)
	d.add([]byte("a"), 3, 33, 3) // wraps: next points at the oldest
	c := &checkpoint{seq: 42, clock: -1, agg: []byte("state"), sessions: map[string]session{"a": {5, 60, "u", "tcp"}, "b": {4, 0, "", "tcp"}}, rings: d.rings,
		awaitRel: pidSets{"a": {7: true, 65535: true}},
		subs:     map[string]map[string]subscription{"a": {"x/#": {qos: 1, retainAsPublish: true, identifier: 3}, "y": {}}}}
	b := c.encode()
	got, err := decodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.seq != 42 || got.clock != -1 || string(got.agg) != "state" || !reflect.DeepEqual(got.sessions, c.sessions) ||
		!reflect.DeepEqual(got.awaitRel, c.awaitRel) || !reflect.DeepEqual(got.subs, c.subs) {
		t.Errorf("got %+v", got)
	}
	if r := got.rings["a"]; len(r.ents) != 2 || r.ents[0] != newDupEntry(2, 22) || r.ents[1] != newDupEntry(3, 33) || r.used != 3 {
		t.Errorf("ring %+v, want oldest first {2 22} {3 33}", r)
	}
	if !bytes.Equal(got.encode(), b) {
		t.Error("re-encoding differs")
	}
	// Encoding the snapshot in place gives the same bytes, for snapshots
	// whose length takes one uvarint byte or several.
	for _, size := range []int{5, 127, 128, 70000} {
		snap := bytes.Repeat([]byte{7}, size)
		c.agg = snap
		want := c.encode()
		c.agg, c.snapshot = nil, func(b []byte) []byte { return append(b, snap...) }
		if got := c.encode(); !bytes.Equal(got, want) {
			t.Errorf("snapshot of %d bytes encoded in place differs", size)
		}
		c.snapshot = nil
	}

	for n := range len(b) {
		if _, err := decodeCheckpoint(b[:n]); err == nil {
			t.Fatalf("truncated checkpoint (%d of %d bytes) decoded", n, len(b))
		}
	}
}

// TestStateDB writes checkpoints with an aggregator whose closed windows
// live in the state file, reads windows back, expires them, reopens the
// file, and sets aside a file that is not a database.
func TestStateDB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := openStateDB(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg := aggregate.DefaultConfig()
	cfg.MaxRetained = 1
	cfg.AllowedLateness = 5 * time.Minute
	var now time.Time
	agg, err := aggregate.New(cfg, func() time.Time { return now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	agg.SetStore(db)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for m := range 4 { // closes the windows of minutes 0, 1 and 2
		now = t0.Add(time.Duration(m)*time.Minute + 10*time.Second)
		agg.Add(aggregate.Reading{Device: "d", Metric: "t", Time: now, Value: float64(m)})
	}
	written, deleted, err := db.commit([]byte("cp1"), agg)
	if err != nil || written != 3 || deleted != 0 {
		t.Fatalf("commit: %d written, %d deleted, %v; want 3, 0", written, deleted, err)
	}
	w, ok, err := db.Load("d", "t", t0.Add(time.Minute).UnixNano())
	if err != nil || !ok || w.Count != 1 || w.Sum != 1 || w.Revision != 1 {
		t.Fatalf("Load minute 1: %+v %v %v", w, ok, err)
	}
	// A late reading for minute 0 is read from the file (RAM holds 1).
	now = t0.Add(3*time.Minute + 30*time.Second)
	if o := agg.Add(aggregate.Reading{Device: "d", Metric: "t", Time: t0.Add(time.Second), Value: 10}); o != aggregate.Revised {
		t.Fatalf("late reading: %v, want revised", o)
	}
	// At 7:30 (watermark 7:25) minutes 0 and 1 are beyond the lateness.
	now = t0.Add(7*time.Minute + 30*time.Second)
	agg.Add(aggregate.Reading{Device: "d", Metric: "t", Time: now, Value: 9})
	written, deleted, err = db.commit([]byte("cp2"), agg)
	if err != nil || deleted != 2 {
		t.Fatalf("second commit: %d written, %d deleted, %v; want minutes 0 and 1 deleted", written, deleted, err)
	}
	if _, ok, _ := db.Load("d", "t", t0.UnixNano()); ok {
		t.Error("expired window still stored")
	}
	db.Close()

	db, err = openStateDB(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := db.checkpoint(); err != nil || string(cp) != "cp2" {
		t.Errorf("reopened: checkpoint %q, %v", cp, err)
	}
	if w, ok, _ := db.Load("d", "t", t0.Add(2*time.Minute).UnixNano()); !ok || w.Sum != 2 || w.Count != 1 {
		t.Errorf("reopened: minute 2 = %+v, %v", w, ok)
	}
	db.Close()

	os.WriteFile(path, bytes.Repeat([]byte("not a database "), 1000), 0o600)
	db, err = openStateDB(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("damaged state file: %v; want it set aside", err)
	}
	defer db.Close()
	if cp, _ := db.checkpoint(); cp != nil {
		t.Error("fresh state file has a checkpoint")
	}
	if m, _ := filepath.Glob(path + ".damaged-*"); len(m) != 1 {
		t.Errorf("damaged file not set aside: %v", m)
	}
}
