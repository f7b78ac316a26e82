package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/queue"
)

func TestEventRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  []byte
		want Event
	}{
		{"publish", AppendPublish(nil, -5, 1|FlagDup, 65535, "dev-1", "sensors/dev-1/t", []byte("21.5")),
			Event{Kind: KindPublish, At: -5, Flags: 1 | FlagDup, PID: 65535, Client: []byte("dev-1"), Topic: []byte("sensors/dev-1/t"), Payload: []byte("21.5")}},
		{"publish empty payload", AppendPublish(nil, 7, 0, 0, "", "t", nil),
			Event{Kind: KindPublish, At: 7, Client: []byte{}, Topic: []byte("t"), Payload: []byte{}}},
		{"publish naming its device", AppendPublishAs(nil, 8, 1, 2, "dev-1:ota", "dev-1", "senml", []byte("[]")),
			Event{Kind: KindPublish, At: 8, Flags: 1 | FlagDevice, PID: 2, Client: []byte("dev-1:ota"), Device: []byte("dev-1"), Topic: []byte("senml"), Payload: []byte("[]")}},
		// The layout before FlagDevice existed, byte for byte: it decodes
		// as it did, naming no device.
		{"publish, older layout", []byte{'P', 0x0a, 0x01, 0x03, 0x02, 'd', '1', 0x01, 't', '9'},
			Event{Kind: KindPublish, At: 5, Flags: 1, PID: 3, Client: []byte("d1"), Topic: []byte("t"), Payload: []byte("9")}},
		{"tick", appendClock(nil, KindTick, 1e18), Event{Kind: KindTick, At: 1e18}},
		{"flush", appendClock(nil, KindFlush, 3), Event{Kind: KindFlush, At: 3}},
		{"session start", appendSessionStart(nil, 9, "c", Session{Proto: 5, Expiry: 3600, Username: "u", Listener: "tcp"}),
			Event{Kind: KindSessionStart, At: 9, Client: []byte("c"), Session: Session{Proto: 5, Expiry: 3600, Username: "u", Listener: "tcp"}}},
		{"session end", appendSessionEnd(nil, 9, "c"), Event{Kind: KindSessionEnd, At: 9, Client: []byte("c")}},
		{"pubrel", appendPubrel(nil, 9, "c", 513), Event{Kind: KindPubrel, At: 9, Client: []byte("c"), PID: 513}},
		{"received", appendReceived(nil, 9, "c", 1<<40), Event{Kind: KindReceived, At: 9, Client: []byte("c"), Upto: 1 << 40}},
		{"subscribe", appendSubscribe(nil, 9, "c", "a/#", Subscription{QoS: 2, RetainHandling: 1, NoLocal: true, Identifier: 7}),
			Event{Kind: KindSubscribe, At: 9, Client: []byte("c"), Topic: []byte("a/#"), Sub: Subscription{QoS: 2, RetainHandling: 1, NoLocal: true, Identifier: 7}}},
		{"unsubscribe", appendUnsubscribe(nil, 9, "c", "a/#"), Event{Kind: KindUnsubscribe, At: 9, Client: []byte("c"), Topic: []byte("a/#")}},
		{"clock", appendClockState(nil, 9, ClockState{Boot: "b-1", Synchronized: true, MaxError: 16000}),
			Event{Kind: KindClock, At: 9, Clock: ClockState{Boot: "b-1", Synchronized: true, MaxError: 16000}}},
		{"tick with a monotonic time", stampMono(appendClock(nil, KindTick, -1), 0, 1<<40),
			Event{Kind: KindTick, At: -1, Mono: 1 << 40, HasMono: true}},
		{"local publish with a monotonic time", stampMono(AppendPublish(nil, 1e18, FlagLocal, 0, "sensor:a", "s/a/t", []byte("1")), 0, 5),
			Event{Kind: KindPublish, At: 1e18, Mono: 5, HasMono: true, Flags: FlagLocal, Client: []byte("sensor:a"), Topic: []byte("s/a/t"), Payload: []byte("1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeEvent(tc.rec)
			if err != nil {
				t.Fatal(err)
			}
			norm := func(e Event) Event { // nil and empty slices alike
				for _, p := range []*[]byte{&e.Client, &e.Topic, &e.Payload} {
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
			if tc.want.Kind != KindPublish {
				for n := range len(tc.rec) {
					if _, err := DecodeEvent(tc.rec[:n]); err == nil {
						t.Errorf("prefix of %d bytes decoded", n)
					}
				}
			}
		})
	}
	for _, bad := range [][]byte{nil, {'X', 0}, {KindTick}, append(appendClock(nil, KindTick, 1), 0),
		{KindTick | monoBit, 2}, append(appendClockState(nil, 1, ClockState{Boot: "b"})[:4], 2, 0)} {
		if _, err := DecodeEvent(bad); !errors.Is(err, errEvent) {
			t.Errorf("decodeEvent(%q) = %v, want errEvent", bad, err)
		}
	}
}

// TestJournalStampsClock: with a monotonic clock every record carries its
// monotonic time, and a clock state given to SetClock is journaled just
// before the next event, once.
func TestJournalStampsClock(t *testing.T) {
	l, err := queue.Open(t.TempDir(), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var got []Event
	mono := time.Duration(0)
	j := New(l, Options{Now: func() time.Time { return time.Unix(100, 0) }, Mono: func() time.Duration { mono += time.Second; return mono },
		Apply: func(first uint64, recs [][]byte) {
			for _, r := range recs {
				e, err := DecodeEvent(r)
				if err != nil {
					t.Errorf("record %q: %v", r, err)
				}
				got = append(got, e)
			}
		}})
	j.SetClock(ClockState{Boot: "b-1"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- j.Run(ctx) }()
	if b, err := j.Clock(KindTick); err != nil || b.Wait() != nil {
		t.Fatal(err)
	}
	if err := j.Local("sensor:a", "s/a/t", []byte("1")); err != nil {
		t.Fatal(err)
	}
	j.SetClock(ClockState{Boot: "b-1", Synchronized: true})
	if b, err := j.Clock(KindTick); err != nil || b.Wait() != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var kinds []byte
	for i, e := range got {
		kinds = append(kinds, e.Kind)
		if !e.HasMono || e.At != 100e9 {
			t.Errorf("event %d: %+v: want wall 100 s and a monotonic time", i, e)
		}
	}
	// One monotonic reading per event: a clock state shares its event's.
	if string(kinds) != "CTPCT" || got[0].Mono != got[1].Mono || got[1].Mono >= got[2].Mono || got[2].Flags != FlagLocal ||
		!got[3].Clock.Synchronized || got[0].Clock.Synchronized || got[0].Clock.Boot != "b-1" {
		t.Errorf("events %s: %+v", kinds, got)
	}
}

func TestDedupe(t *testing.T) {
	d := NewDedupe(3)
	h := func(s string) uint64 { return ContentHash([]byte("t"), []byte(s)) }
	a := []byte("a")
	if ContentHash([]byte("ab"), []byte("c")) == ContentHash([]byte("a"), []byte("bc")) {
		t.Error("topic/payload boundary not in the hash")
	}
	steps := []struct {
		pid  uint16
		v    string
		dup  bool
		want bool // a duplicate
	}{
		{1, "x", false, false},
		{2, "y", false, false},
		{1, "x", true, true},   // pid 1's PUBACK lost: a resend
		{2, "x", true, false},  // pid 2 holds y: a new publication whose first copy was lost
		{2, "x", true, true},   // ... and its resend
		{1, "x", false, false}, // without DUP: always new
		{3, "x", true, false},  // a DUP never seen: its first copy was lost
	}
	for i, s := range steps {
		if got := d.Publication(a, s.pid, h(s.v), s.dup, uint64(10+i)); got != s.want {
			t.Errorf("step %d %+v: duplicate %v", i, s, got)
		}
	}
	// Every packet id a client may resend is kept, up to the per-client
	// bound, whatever its window: 8,000 publications, each resent.
	for pid := range uint16(8000) {
		d.Publication([]byte("b"), pid, h("v"), false, uint64(100+int(pid)))
	}
	for pid := range uint16(8000) {
		if !d.Publication([]byte("b"), pid, h("v"), true, 100_000) {
			t.Fatalf("pid %d's resend not recognised", pid)
		}
	}
	// Received ends the entries up to its sequence: pid 1 (15) and 2
	// (14) go, pid 3 (16) stays.
	d.Received(a, 15)
	if d.Publication(a, 1, h("x"), true, 20) || !d.Publication(a, 3, h("x"), true, 21) {
		t.Error("Received: entries up to 15 end, the later one stays")
	}
	// A resend takes its entry over: a receipt before the resend does
	// not end it.
	d.Received(a, 20)
	if !d.Publication(a, 3, h("x"), true, 22) {
		t.Error("a receipt older than the resend ended its entry")
	}
	d.Released(a, 3)
	if d.Publication(a, 3, h("x"), true, 23) {
		t.Error("Released: a QoS 2 publication whose PUBREL came is not resent")
	}
	// A client that resends without DUP (MQTT.js) after it reconnects:
	// the content of an entry from an earlier connection is a resend; on
	// the connection itself, a publication without DUP is always new
	// (firmware with one packet id repeats values).
	m := []byte("m")
	d.Publication(m, 7, h("1"), false, 300)
	if d.Publication(m, 7, h("1"), false, 301) {
		t.Error("same connection: a publication without DUP taken for a resend")
	}
	d.Connected(m, 302)
	if !d.Publication(m, 7, h("1"), false, 303) {
		t.Error("after a reconnect: a resend without DUP not recognised")
	}
	if d.Publication(m, 7, h("1"), false, 304) {
		t.Error("the resend took the entry over: the next one on the connection is new")
	}
	// Three clients at most: the least recently used goes.
	d.Publication([]byte("c"), 1, h("x"), false, 200_000)
	if _, ok := d.Rings["a"]; ok || len(d.Rings) != 3 {
		t.Errorf("clients %v: the least recently used should be evicted", slices.Collect(maps.Keys(d.Rings)))
	}
}

// TestDedupeBounds: a client's entries beyond the per-client bound go
// oldest first, down to three quarters of it; beyond the total, the
// largest client's oldest half goes, until all are within it.
func TestDedupeBounds(t *testing.T) {
	d := NewDedupe(10)
	d.Bound(8, 10)
	for i := range 9 {
		d.Publication([]byte("a"), uint16(i), 1, false, uint64(i))
	}
	if n := len(d.Rings["a"].ents); n != 6 || d.Evicted != 3 {
		t.Fatalf("a holds %d entries, %d evicted; want 6, 3", n, d.Evicted)
	}
	if d.Publication([]byte("a"), 2, 1, true, 100) || !d.Publication([]byte("a"), 3, 1, true, 101) {
		t.Error("the oldest should go: pid 2 gone, pid 3 kept")
	}
	for i := range 5 {
		d.Publication([]byte("b"), uint16(i), 1, false, uint64(200+i))
	}
	d.Bounded() // 7 (a's, pid 2 back) + 5 = 12 > 10: a, the largest, is halved
	if na, nb := len(d.Rings["a"].ents), len(d.Rings["b"].ents); na != 3 || nb != 5 || d.Entries() > 10 {
		t.Errorf("a %d, b %d entries after Bounded; want 3, 5", na, nb)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	d := NewDedupe(10)
	d.Publication([]byte("a"), 1, 11, false, 1)
	d.Publication([]byte("a"), 2, 22, false, 2)
	d.Publication([]byte("a"), 1, 33, false, 3) // pid 1 reused
	d.Connected([]byte("a"), 4)
	c := &Checkpoint{Seq: 42, Clock: -1, Agg: []byte("state"), Sessions: map[string]Session{"a": {5, 60, "u", "tcp"}, "b": {4, 0, "", "tcp"}}, Rings: d.Rings,
		AwaitRel: PIDSets{"a": {7: true, 65535: true}},
		Subs:     map[string]map[string]Subscription{"a": {"x/#": {QoS: 1, RetainAsPublished: true, Identifier: 3}, "y": {}}},
		Time:     TimeLine{Valid: true, Boot: "b-1", Synchronized: true, HasMono: true, Wall: 1e18, Mono: 5e9, Elapsed: 7, Offset: -2},
		Hold:     Hold{Start: 9, Records: 2, Readings: 3, Bytes: 300, Since: 6, Rebased: 11, Unverified: 12}}
	b := c.Encode()
	got, err := DecodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Seq != 42 || got.Clock != -1 || string(got.Agg) != "state" || !reflect.DeepEqual(got.Sessions, c.Sessions) ||
		!reflect.DeepEqual(got.AwaitRel, c.AwaitRel) || !reflect.DeepEqual(got.Subs, c.Subs) || got.Time != c.Time || got.Hold != c.Hold {
		t.Errorf("got %+v", got)
	}
	if r := got.Rings["a"]; !maps.Equal(r.ents, map[uint16]dupEntry{1: {33, 3}, 2: {22, 2}}) || r.used != 3 || r.since != 4 {
		t.Errorf("entries %+v, want pid 1 {33 3}, pid 2 {22 2}", r)
	}
	if !bytes.Equal(got.Encode(), b) {
		t.Error("re-encoding differs")
	}
	// Encoding the snapshot in place gives the same bytes, for snapshots
	// whose length takes one uvarint byte or several.
	for _, size := range []int{5, 127, 128, 70000} {
		snap := bytes.Repeat([]byte{7}, size)
		c.Agg = snap
		want := c.Encode()
		c.Agg, c.Snapshot = nil, func(b []byte) []byte { return append(b, snap...) }
		if got := c.Encode(); !bytes.Equal(got, want) {
			t.Errorf("snapshot of %d bytes encoded in place differs", size)
		}
		c.Snapshot = nil
	}

	for n := range len(b) {
		if _, err := DecodeCheckpoint(b[:n]); err == nil {
			t.Fatalf("truncated checkpoint (%d of %d bytes) decoded", n, len(b))
		}
	}

	// A version 2 checkpoint's entries (a client's latest publications,
	// oldest first, without their sequences) are read as of the client's
	// latest publication; a later one with the same id replaces the
	// earlier.
	empty := &Checkpoint{Seq: 42, Clock: -1, Agg: []byte("s")}
	v3 := empty.Encode()
	head := len(checkpointMagic) + 1 + 1 + 1 + 2 + 1 // seq, clock, agg, no sessions
	if v3[head] != 0 {
		t.Fatalf("no empty dedupe section at %d: %x", head, v3)
	}
	old2 := append([]byte(nil), v3[:head]...)
	old2 = append(old2, 1, 1, 'a', 7, 2, 5)
	old2 = binary.LittleEndian.AppendUint64(old2, 0xaabb)
	old2 = append(old2, 5)
	old2 = binary.LittleEndian.AppendUint64(old2, 0xccdd)
	old2 = append(old2, v3[head+1:len(v3)-4]...)
	old2[4] = 2
	old2 = binary.LittleEndian.AppendUint32(old2, crc32.Checksum(old2, castagnoli))
	if got, err := DecodeCheckpoint(old2); err != nil || !maps.Equal(got.Rings["a"].ents, map[uint16]dupEntry{5: {0xccdd, 7}}) {
		t.Errorf("version 2 entries: %v, %+v", err, got)
	}

	// A version 1 checkpoint (before the time line) still decodes, with
	// no time line.
	c.Time, c.Hold, c.Rings = TimeLine{}, Hold{}, nil
	v2 := c.Encode()
	body := v2[:len(v2)-4]
	body = body[:len(body)-(len(appendString(nil, ""))+1+4+7)] // the empty time line: "", flags, 4 zero varints; the empty hold: 7 more
	v1 := append([]byte(nil), body...)
	v1[4] = 1
	v1 = binary.LittleEndian.AppendUint32(v1, crc32.Checksum(v1, castagnoli))
	old, err := DecodeCheckpoint(v1)
	if err != nil || old.Time.Valid || old.Seq != 42 || !reflect.DeepEqual(old.Subs, c.Subs) {
		t.Errorf("version 1 checkpoint: %v, %+v", err, old)
	}
}

// TestStateDB writes checkpoints with an aggregator whose closed windows
// live in the state file, reads windows back, expires them, reopens the
// file, and sets aside a file that is not a database.
func TestStateDB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := aggregate.DefaultConfig()
	cfg.MaxRetained = 1
	cfg.AllowedLateness = 5 * time.Minute
	var now time.Time
	agg, err := aggregate.New(cfg, aggregate.WallClock(func() time.Time { return now }), nil)
	if err != nil {
		t.Fatal(err)
	}
	agg.SetStore(db)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for m := range 4 { // closes the windows of minutes 0, 1 and 2
		now = t0.Add(time.Duration(m)*time.Minute + 10*time.Second)
		agg.Add(aggregate.Reading{Device: "d", Metric: "t", Time: now, Value: float64(m)})
	}
	written, deleted, err := db.Commit(1, testCheckpoint(1), agg)
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
	written, deleted, err = db.Commit(2, testCheckpoint(2), agg)
	if err != nil || deleted != 2 {
		t.Fatalf("second commit: %d written, %d deleted, %v; want minutes 0 and 1 deleted", written, deleted, err)
	}
	if _, ok, _ := db.Load("d", "t", t0.UnixNano()); ok {
		t.Error("expired window still stored")
	}
	db.Close()

	db, err = OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := db.Checkpoint(); err != nil || !bytes.Equal(cp, testCheckpoint(2)) {
		t.Errorf("reopened: checkpoint %q, %v", cp, err)
	}
	if prev, err := os.ReadFile(filepath.Join(filepath.Dir(path), PreviousName)); err != nil || !bytes.Equal(prev, testCheckpoint(1)) {
		t.Errorf("%s = %q, %v; want the first checkpoint", PreviousName, prev, err)
	}
	if w, ok, _ := db.Load("d", "t", t0.Add(2*time.Minute).UnixNano()); !ok || w.Sum != 2 || w.Count != 1 {
		t.Errorf("reopened: minute 2 = %+v, %v", w, ok)
	}
	db.Close()

	// A file that is not a database: set aside, and the state is taken
	// from the previous checkpoint.
	os.WriteFile(path, bytes.Repeat([]byte("not a database "), 1000), 0o600)
	qdir := filepath.Join(t.TempDir(), "quarantine")
	db, err = OpenStateDB(path, StateOptions{Quarantine: qdir})
	if err != nil {
		t.Fatalf("damaged state file: %v; want it set aside", err)
	}
	defer db.Close()
	if cp, _ := db.Checkpoint(); !bytes.Equal(cp, testCheckpoint(1)) {
		t.Errorf("rebuilt state file has checkpoint %q, want the previous one", cp)
	}
	rec := db.Recovery()
	if !rec.Rebuilt || rec.From != PreviousName || rec.Seq != 1 || !rec.WindowsLost || len(rec.Quarantined) != 1 {
		t.Errorf("recovery %+v", rec)
	}
	if m, _ := filepath.Glob(filepath.Join(qdir, "state.db.*")); len(m) != 1 {
		t.Errorf("damaged file not kept in quarantine: %v", m)
	} else if b, _ := os.ReadFile(m[0]); !bytes.HasPrefix(b, []byte("not a database ")) {
		t.Errorf("quarantine holds %q, not the damaged file", b[:min(len(b), 20)])
	}
}

// TestCheckpointSections: the Sparkplug host state rides in an optional
// section; a checkpoint without one is what older gateways wrote (and
// read), and a section this version does not know is skipped.
func TestCheckpointSections(t *testing.T) {
	c := &Checkpoint{Seq: 7, Clock: 99, Agg: []byte("agg"), Sessions: map[string]Session{"a": {4, 0, "", "tcp"}}}
	old := c.Encode()
	got, err := DecodeCheckpoint(old)
	if err != nil || got.Sparkplug != nil {
		t.Fatalf("checkpoint without host state: %v, %q", err, got.Sparkplug)
	}
	c.Sparkplug = []byte("host state")
	b := c.Encode()
	if !bytes.Equal(b[:len(old)-4], old[:len(old)-4]) {
		t.Fatal("the section changed the fields before it")
	}
	if got, err = DecodeCheckpoint(b); err != nil || string(got.Sparkplug) != "host state" || got.Seq != 7 || !reflect.DeepEqual(got.Sessions, c.Sessions) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if !bytes.Equal(got.Encode(), b) {
		t.Error("re-encoding differs")
	}
	// A later version's section, before and after ours.
	body := append([]byte(nil), old[:len(old)-4]...)
	body = append(body, 'X', 3, 'n', 'e', 'w', 'S', 2, 'h', 's', 'Z', 0)
	body = binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
	if got, err = DecodeCheckpoint(body); err != nil || string(got.Sparkplug) != "hs" {
		t.Fatalf("with unknown sections: %+v, %v", got, err)
	}
	for n := len(old); n < len(b); n++ {
		if _, err := DecodeCheckpoint(b[:n]); err == nil {
			t.Fatalf("truncated checkpoint (%d of %d bytes) decoded", n, len(b))
		}
	}
}

// testCheckpoint is a checkpoint of journal sequence seq.
func testCheckpoint(seq uint64) []byte {
	return (&Checkpoint{Seq: seq, Clock: int64(seq)}).Encode()
}

// TestJournalBoundsPending: while the card holds an fsync (here: a long
// storage.fsync_interval), QoS 0 publications, which nobody waits for,
// pile up in memory unless the journal bounds them: with MaxPending, a
// publisher waits once that many bytes wait for the card, and what waits
// never exceeds it by more than one publication. Unbounded (as before),
// 100 publications of 200 KiB wait all at once.
func TestJournalBoundsPending(t *testing.T) {
	const size, n = 200 << 10, 100
	payload := make([]byte, size)
	peak := func(bound int) (int, uint64) {
		l, err := queue.Open(t.TempDir(), queue.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		j := New(l, Options{Interval: 300 * time.Millisecond, MaxPending: bound, Apply: func(uint64, [][]byte) {}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- j.Run(ctx) }()
		published := make(chan struct{})
		go func() {
			defer close(published)
			for i := range n {
				if _, _, err := j.Publish("flood", "", nil, 0, 0, "sensors/flood/t", payload, false); err != nil {
					t.Errorf("publication %d: %v", i, err)
					return
				}
			}
		}()
		most := 0
		for {
			most = max(most, j.Pending())
			select {
			case <-published:
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return most, j.PendingWaits()
			case <-time.After(time.Millisecond):
			}
		}
	}
	if most, _ := peak(1 << 40); most < 20*size {
		t.Errorf("unbounded: at most %d bytes waited; the test's card is not slow enough to show anything", most)
	}
	const bound = 2 << 20
	most, waits := peak(bound)
	if most >= bound+size+100 || waits == 0 {
		t.Errorf("bounded at %d: %d bytes waited at once, publications waited %d times", bound, most, waits)
	}
}
