package broker

import (
	"testing"
	"time"
)

// TestReceipts: an acknowledgement counts as received once the client's
// TCP acknowledged its bytes in a sample at least mqtt.receipt_margin
// older than the tick (or the connection's end) that settles it; or at
// once, by what its TCP acknowledged, when the client sends DISCONNECT. A receipt is told
// every receiptEvery publications, receiptQuiet after it was learnt, and
// at the end.
func TestReceipts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := receipts{margin: DefaultReceiptMargin}
	r.journaled = 100
	r.written(70, 70) // 70 PUBACKs written, the latest for seq 70
	r.tick(at(0), 0, 280)
	if r.got.n != 0 {
		t.Fatalf("received %d before any sample", r.got.n)
	}
	r.written(100, 30)
	r.tick(at(990), 280, 400) // the first mark is acknowledged by now
	if r.got.n != 0 {
		t.Errorf("received %d with no sample a margin old", r.got.n)
	}
	r.tick(at(1995), 300, 400) // the 990 sample is 1.005 s old
	if r.got != (mark{70, 70}) {
		t.Errorf("received %+v, want the first mark {70 70}", r.got)
	}
	if upto, ok := r.toTell(at(2995), false); !ok || upto != 70 {
		t.Errorf("told %d %v, want 70 (64 publications or more)", upto, ok)
	}
	// The connection ends 0.5 s after the sample that covers the rest:
	// too soon (a proxy may not have forwarded it).
	r.tick(at(3500), 400, 400)
	r.settle(at(4000))
	if r.got != (mark{70, 70}) {
		t.Errorf("received %+v at an end 0.5 s after the acknowledgement", r.got)
	}
	r.settle(at(4600))
	if r.got != (mark{100, 100}) {
		t.Errorf("received %+v at an end 1.1 s after the acknowledgement, want {100 100}", r.got)
	}
	if _, ok := r.toTell(at(4600), false); ok {
		t.Error("30 more received told before receiptQuiet")
	}
	if upto, ok := r.toTell(at(4600), true); !ok || upto != 100 {
		t.Errorf("told %d %v at the end, want 100", upto, ok)
	}
	if _, ok := r.toTell(at(4600), true); ok {
		t.Error("told twice")
	}
	// A quiet client's receipts are told after receiptQuiet.
	r.journaled++
	r.written(101, 1)
	r.tick(at(5000), 400, 404)
	r.tick(at(6000), 404, 404)
	r.tick(at(7100), 404, 404)
	if _, ok := r.toTell(at(7100), false); ok {
		t.Error("one publication told 2.5 s after the last receipt")
	}
	if upto, ok := r.toTell(at(14_700), false); !ok || upto != 101 {
		t.Errorf("told %d %v after receiptQuiet, want 101", upto, ok)
	}
	// DISCONNECT: what the client's TCP has acknowledged is received at
	// once; what it has not stays.
	r.journaled += 2
	r.written(103, 2)
	r.disconnected(404, 412)
	if r.got != (mark{101, 101}) {
		t.Errorf("received %+v: a DISCONNECT before the client's TCP took the last PUBACKs", r.got)
	}
	r.disconnected(412, 412)
	if r.got != (mark{103, 103}) {
		t.Errorf("received %+v after DISCONNECT, want {103 103}", r.got)
	}
}
