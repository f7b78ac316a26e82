package broker

import (
	"io"
	"log/slog"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

func TestRetainedAdmit(t *testing.T) {
	const c = 100 // a message's cost in these cases
	limits := RetainedLimits{Count: 3, Bytes: 3 * c, PerIdentity: 2, BytesPerIdentity: 2 * c}
	type held struct{ owner, topic string }
	for name, tc := range map[string]struct {
		held         []held
		owner, topic string
		cost         int64
		want         string // the bound passed; empty: admitted
	}{
		"first":                         {owner: "a", topic: "t1", cost: c},
		"identity's count":              {held: []held{{"a", "t1"}, {"a", "t2"}}, owner: "a", topic: "t3", cost: 1, want: "mqtt.max_retained_per_identity"},
		"identity's bytes":              {held: []held{{"a", "t1"}}, owner: "a", topic: "t2", cost: c + 1, want: "mqtt.max_retained_bytes_per_identity"},
		"replacing its own":             {held: []held{{"a", "t1"}, {"a", "t2"}}, owner: "a", topic: "t2", cost: c},
		"replacing another's":           {held: []held{{"a", "t1"}, {"a", "t2"}, {"b", "t3"}}, owner: "b", topic: "t1", cost: c},
		"total count":                   {held: []held{{"a", "t1"}, {"b", "t2"}, {"c", "t3"}}, owner: "d", topic: "t4", cost: 1, want: "mqtt.max_retained"},
		"total bytes":                   {held: []held{{"a", "t1"}, {"b", "t2"}}, owner: "c", topic: "t3", cost: c + 1, want: "mqtt.max_retained_bytes"},
		"room made by a deletion":       {held: []held{{"a", "t1"}, {"a", "t2"}, {"a", ""}}, owner: "a", topic: "t3", cost: c},
		"another's replacement no room": {held: []held{{"a", "t1"}, {"a", "t2"}, {"b", "t3"}}, owner: "a", topic: "t3", cost: c, want: "mqtt.max_retained_per_identity"},
	} {
		t.Run(name, func(t *testing.T) {
			r := retained{limits: limits}
			for i, h := range tc.held {
				if h.topic == "" { // a deletion of the one before
					r.set("", tc.held[i-1].topic, 0)
					continue
				}
				r.set(h.owner, h.topic, c)
			}
			if why, ok := r.admit(tc.owner, tc.topic, tc.cost); why != tc.want || ok != (tc.want == "") {
				t.Fatalf("admit: %q, %v; want %q", why, ok, tc.want)
			}
		})
	}
	r := retained{limits: limits}
	r.set("a", "t1", c)
	r.set("b", "t1", 2*c)
	r.set("", "t1", 0)
	if n, b := r.held(); n != 0 || b != 0 || len(r.shares) != 0 {
		t.Fatalf("after a replacement and a deletion: %d, %d bytes, shares %v", n, b, r.shares)
	}
}

// TestQueuedRoom: a session at its bound is refused, the others too once
// all of them hold the total; what mochi no longer holds is freed.
func TestQueuedRoom(t *testing.T) {
	b := &Broker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now}
	q := queued{perSession: 300, total: 500}
	client := func(id string) *mqtt.Client {
		cl := &mqtt.Client{ID: id}
		cl.State.Inflight = mqtt.NewInflights()
		return cl
	}
	a, c, d := client("a"), client("c"), client("d")
	for pid := uint16(1); pid <= 3; pid++ {
		if !q.room(b, a) {
			t.Fatalf("message %d refused", pid)
		}
		q.stored(a, pid, 100)
	}
	if q.room(b, a) || q.dropped[DropSessionBytes].Load() != 1 {
		t.Fatal("a session at its bound was not refused")
	}
	q.stored(c, 1, 200)
	if q.room(b, d) || q.dropped[DropTotalBytes].Load() != 1 {
		t.Fatal("a session was not refused with all of them at the total")
	}
	q.stored(a, 1, 100) // resent: counted once
	q.freed(a, 2)       // acknowledged
	if bytes, _ := q.held(); bytes != 400 || !q.room(b, a) || !q.room(b, d) {
		t.Fatalf("after an acknowledgement: %d bytes held, want 400 and room", bytes)
	}
	q.forget("a")
	q.forget("c")
	if bytes, _ := q.held(); bytes != 0 {
		t.Fatalf("after the sessions ended: %d bytes held", bytes)
	}
}
