package gateway

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
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

func TestCheckpointRoundTripAndDamage(t *testing.T) {
	d := newDedupe(2, 10)
	d.add([]byte("a"), 1, 11, 1)
	d.add([]byte("a"), 2, 22, 2)
	d.add([]byte("a"), 3, 33, 3) // wraps: next points at the oldest
	c := &checkpoint{seq: 42, clock: -1, agg: []byte("state"), sessions: map[string]session{"a": {5, 60, "u", "tcp"}, "b": {4, 0, "", "tcp"}}, rings: d.rings}
	b := c.encode()
	got, err := decodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.seq != 42 || got.clock != -1 || string(got.agg) != "state" || !reflect.DeepEqual(got.sessions, c.sessions) {
		t.Errorf("got %+v", got)
	}
	if r := got.rings["a"]; len(r.ents) != 2 || r.ents[0] != (dupEntry{2, 22}) || r.ents[1] != (dupEntry{3, 33}) || r.used != 3 {
		t.Errorf("ring %+v, want oldest first {2 22} {3 33}", r)
	}
	if !bytes.Equal(got.encode(), b) {
		t.Error("re-encoding differs")
	}

	// Newest damaged: set aside, the older one is used.
	dir := t.TempDir()
	older := &checkpoint{seq: 7, sessions: map[string]session{}, rings: map[string]*ring{}}
	os.WriteFile(filepath.Join(dir, checkpointName(7)), older.encode(), 0o600)
	bad := append([]byte(nil), b...)
	bad[len(bad)/2] ^= 1
	os.WriteFile(filepath.Join(dir, checkpointName(42)), bad, 0o600)
	var damaged []string
	cp, err := loadCheckpoint(dir, func(name string, err error) { damaged = append(damaged, name) })
	if err != nil || cp == nil || cp.seq != 7 {
		t.Fatalf("loaded %+v, %v; want the checkpoint at 7", cp, err)
	}
	if len(damaged) != 1 || damaged[0] != checkpointName(42) {
		t.Errorf("damaged = %v", damaged)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointName(42)+".damaged")); err != nil {
		t.Errorf("damaged checkpoint not set aside: %v", err)
	}
	// A file whose name and content disagree is damaged too; none left
	// means start from the journal alone.
	os.WriteFile(filepath.Join(dir, checkpointName(8)), older.encode(), 0o600)
	os.Remove(filepath.Join(dir, checkpointName(7)))
	if cp, err := loadCheckpoint(dir, func(string, error) {}); err != nil || cp != nil {
		t.Errorf("got %+v, %v; want none", cp, err)
	}
	for n := range len(b) {
		if _, err := decodeCheckpoint(b[:n]); err == nil {
			t.Fatalf("truncated checkpoint (%d of %d bytes) decoded", n, len(b))
		}
	}
}
