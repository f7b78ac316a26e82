package broker

import (
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/edgegate/edgegate/gateway/journal"
	mqtt "github.com/mochi-mqtt/server/v2"
)

// Receipts: which acknowledgements a client has received.
//
// A client resends, with DUP, every QoS 1/2 publication whose PUBACK (or
// PUBREC) it has not received, and duplicate detection (journal.Dedupe)
// must keep an entry for each until the client has it. Writing a PUBACK
// is not enough: it may still be in the socket's buffers when the
// connection breaks, or the gateway stops, and then the client never gets
// it. So the broker asks the connection's TCP stack how much of what was
// written the client's TCP has acknowledged (TCP_INFO bytes_acked), once
// a second for each connection with publications whose receipt is not
// known, and notes where in the byte stream the latest acknowledgement
// written so far ends. An acknowledgement counts as received once the
// client's TCP acknowledged its bytes, and then
//
//   - the connection lasted mqtt.receipt_margin more: a TCP proxy between
//     the client and the gateway acknowledges bytes it has not forwarded
//     yet, and a cut then loses them, within the margin; a client that
//     crashes just after its TCP took them breaks the connection too; or
//   - the client ended the connection with DISCONNECT: it is alive and
//     done (mosquitto_pub, a sleepy device), and a proxy does not make one.
//
// (A client whose TCP took a PUBACK, which lost its power in the
// milliseconds before it read it, and whose connection the gateway sees
// open past the margin, is taken to have it: if it kept the publication
// on disk, its resend counts again. The wire cannot tell it from firmware
// that has the PUBACK and reuses the packet id and value for its next
// reading, whose first copy is lost with the link.)
//
// What is received is journaled (journal.KindReceived) every
// receiptEvery publications, receiptQuiet after it was learnt, and when
// the connection ends; the applier drops the entries up to it. (After a
// SIGKILL or a power cut, which end no connection, what was learnt in
// the receiptQuiet before is not journaled: those publications are taken
// for resends if they come again, as from a client whose PUBACK was lost.)
//
// The cost: one getsockopt and one ioctl a second per connection that
// published since its last receipt, and a journal record of about 30
// bytes per receiptEvery publications.
const (
	receiptTick = time.Second
	// DefaultReceiptMargin is mqtt.receipt_margin's default.
	DefaultReceiptMargin = time.Second
	receiptEvery         = 64
	receiptQuiet         = 10 * time.Second
	// maxMarks caps the positions kept per connection: one per tick while
	// the client's TCP has not acknowledged them (a client that does not
	// read is disconnected by mqtt.write_timeout).
	maxMarks = 64
)

// maxUnreceived is how many publications a connection may have whose
// acknowledgement it is not known to have received before it is no
// longer read: 16 × mqtt.receive_maximum, and at least 4,096 (the entries
// duplicate detection holds for it, 24 bytes each). Receipts lag by
// receiptTick + mqtt.receipt_margin, so a client
// within mqtt.publish_rate_per_client (1,000/s) does not wait for it.
func maxUnreceived(receiveMaximum int) uint64 { return uint64(max(16*receiveMaximum, 4096)) }

// mark is a point in a connection's publications: the journal sequence of
// one, and how many were journaled up to it.
type mark struct{ seq, n uint64 }

// receipts follows one connection's acknowledgements from written to
// received. The ackWriter's mutex guards it.
type receipts struct {
	journaled uint64 // QoS 1/2 publications journaled on this connection
	wr        mark   // the latest whose acknowledgement is written
	// syncSeq is a publication mochi acknowledges once OnPublish returns
	// (QoS 2, retained, routed): written once the client's next packet is
	// read.
	syncSeq     uint64
	syncPending bool
	// syncFlag mirrors syncPending for readNext, outside the mutex.
	syncFlag atomic.Bool
	// marks are written acknowledgements by where they end in the
	// connection's byte stream (as the TCP stack counts acknowledged
	// bytes), oldest first.
	marks []rawMark
	// samples are the bytes the client's TCP had acknowledged at the
	// latest two ticks, older first.
	samples [2]sample
	margin  time.Duration // mqtt.receipt_margin
	got     mark          // received
	told    mark          // journaled as received
	toldAt  time.Time     // when
}

type rawMark struct {
	end uint64
	m   mark
}

type sample struct {
	at    time.Time
	acked uint64
	ok    bool
}

// written notes that the acknowledgements of n more publications, the
// latest journaled as last, are written.
func (r *receipts) written(last, n uint64) {
	r.wr.n += n
	r.wr.seq = max(r.wr.seq, last)
}

// settleSync notes that mochi wrote the acknowledgement of the
// publication OnPublish handed it.
func (r *receipts) settleSync() {
	if r.syncPending {
		r.syncPending = false
		r.syncFlag.Store(false)
		r.written(r.syncSeq, 1)
	}
}

// unreceived is how many publications the client is not known to have
// the acknowledgement of.
func (r *receipts) unreceived() uint64 { return r.journaled - r.got.n }

// active reports whether the connection has publications whose receipt
// is not known.
func (r *receipts) active() bool { return r.journaled > r.got.n || len(r.marks) > 0 }

// receive counts as received every mark whose bytes the client's TCP had
// acknowledged by sample s.
func (r *receipts) receive(s sample) {
	if !s.ok {
		return
	}
	i := 0
	for i < len(r.marks) && r.marks[i].end <= s.acked {
		r.got = r.marks[i].m
		i++
	}
	r.marks = append(r.marks[:0], r.marks[i:]...)
}

// tick takes a sample at now: acked bytes acknowledged by the client's
// TCP, end where what was written so far ends. What earlier samples allow
// is settled first.
func (r *receipts) tick(now time.Time, acked, end uint64) {
	r.settle(now)
	r.samples[0], r.samples[1] = r.samples[1], sample{at: now, acked: acked, ok: true}
	if n := len(r.marks); r.wr.n > r.got.n && (n == 0 || r.marks[n-1].m.n < r.wr.n) {
		if n == maxMarks {
			r.marks[n-1] = rawMark{end, r.wr} // later and further: received no sooner
		} else {
			r.marks = append(r.marks, rawMark{end, r.wr})
		}
	}
}

// settle settles what is known at now: the newest sample at least
// mqtt.receipt_margin older than now.
func (r *receipts) settle(now time.Time) {
	for i := 1; i >= 0; i-- {
		if s := r.samples[i]; s.ok && now.Sub(s.at) >= r.margin {
			r.receive(s)
			return
		}
	}
}

// disconnected settles what the client's DISCONNECT allows: everything
// its TCP has acknowledged now (acked), what was written ending at end.
func (r *receipts) disconnected(acked, end uint64) {
	if r.wr.n > r.got.n {
		r.marks = append(r.marks, rawMark{end, r.wr})
	}
	r.receive(sample{acked: acked, ok: true})
}

// toTell returns the receipt to journal at now: after receiptEvery
// publications or receiptQuiet, and with final (the connection ended)
// whatever was received since the last.
func (r *receipts) toTell(now time.Time, final bool) (uint64, bool) {
	if r.got.n > r.told.n && (final || r.got.n-r.told.n >= receiptEvery || now.Sub(r.toldAt) >= receiptQuiet) {
		r.told, r.toldAt = r.got, now
		return r.got.seq, true
	}
	return 0, false
}

// tcpSent returns how many bytes of c's stream the peer's TCP has
// acknowledged and where what was written so far ends, both counted as
// the kernel counts acknowledged bytes; ok is false when c is not a TCP
// connection this platform can tell of. It looks through wrappers with a
// NetConn method (TLS, WebSocket, deadlineConn): their writes have reached
// the socket when they return.
func tcpSent(c net.Conn) (acked, end uint64, ok bool) {
	for {
		switch v := c.(type) {
		case *net.TCPConn:
			return tcpSentLinux(v)
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return 0, 0, false
		}
	}
}

// tickWithout is the sample of a connection whose TCP stack tells
// nothing: what was written counts as received after mqtt.receipt_margin, as
// the best that can be said.
func (r *receipts) tickWithout(now time.Time) { r.tick(now, math.MaxUint64, 0) }

// tick samples the connection (the broker's receipt goroutine, once a
// receiptTick) and returns a receipt to journal. A connection whose lock
// is held (a write waiting for a client that does not read) is skipped.
func (w *ackWriter) tick(now time.Time) (uint64, bool) {
	w.mu.Lock()
	active := w.rc.active()
	w.mu.Unlock()
	if !active {
		return 0, false
	}
	cl := w.cl
	if !cl.TryLock() {
		return 0, false
	}
	// Under the client's lock nothing is written meanwhile: what the
	// marks say is written is in the stream before end.
	if cl.Closed() || cl.Net.Conn == nil {
		cl.Unlock()
		return 0, false
	}
	acked, end, ok := tcpSent(cl.Net.Conn)
	w.mu.Lock()
	cl.Unlock()
	defer w.mu.Unlock()
	got := w.rc.got
	if ok {
		w.rc.tick(now, acked, end)
	} else {
		w.rc.tickWithout(now)
	}
	if w.rc.got != got {
		w.b.acksReceived.Add(w.rc.got.n - got.n)
		w.wakeLocked()
	}
	return w.rc.toTell(now, false)
}

// ended settles the connection's receipts as it ends and returns the last
// one to journal.
func (w *ackWriter) ended(now time.Time) (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	got := w.rc.got
	w.rc.settle(now)
	w.b.acksReceived.Add(w.rc.got.n - got.n)
	return w.rc.toTell(now, true)
}

// disconnecting settles what the client's DISCONNECT allows (it is read
// in the client's goroutine: mochi has written every acknowledgement it
// owes for the publications before it).
func (w *ackWriter) disconnecting() {
	cl := w.cl
	cl.Lock()
	acked, end, ok := uint64(math.MaxUint64), uint64(0), true
	if !cl.Closed() && cl.Net.Conn != nil {
		acked, end, ok = tcpSent(cl.Net.Conn)
	}
	w.mu.Lock()
	cl.Unlock()
	defer w.mu.Unlock()
	if !ok {
		return // nothing known: the margin rule settles it at the end
	}
	got := w.rc.got
	w.rc.disconnected(acked, end)
	w.b.acksReceived.Add(w.rc.got.n - got.n)
}

// journaled counts a QoS 1/2 publication of the connection journaled as
// seq; with sync, mochi writes its acknowledgement once OnPublish returns.
func (w *ackWriter) journaled(seq uint64, sync bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rc.journaled++
	if sync {
		w.rc.settleSync()
		w.rc.syncSeq, w.rc.syncPending = seq, true
		w.rc.syncFlag.Store(true)
	}
}

// readNext notes that the client's next packet is being read: mochi has
// written the acknowledgement of the publication before it.
func (w *ackWriter) readNext() {
	if !w.rc.syncFlag.Load() {
		return
	}
	w.mu.Lock()
	w.rc.settleSync()
	w.mu.Unlock()
}

// admit holds the client's next QoS 1/2 publication, and so the reading
// of its socket (TCP flow control then slows the client down), while the
// connection has rm publications in flight or maxUnreceived whose
// acknowledgement it is not known to have received. It returns false if
// the connection closed meanwhile, or if nothing changed for stall (no
// PUBACK written, no receipt learnt: the client does not read, and its
// reading is held, so no write of the gateway's waits to time out); held
// reports that it waited.
func (w *ackWriter) admit(rm int32, maxUnreceived uint64, stall time.Duration) (ok, held, stalled bool) {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	since := time.Now()
	for {
		w.mu.Lock()
		if w.unwritten1.Load()+w.open2.Load() < rm && w.rc.unreceived() < maxUnreceived {
			w.mu.Unlock()
			return true, held, false
		}
		held = true
		if w.changed == nil {
			w.changed = make(chan struct{})
		}
		ch := w.changed
		w.mu.Unlock()
		if w.cl.Closed() {
			return false, held, false
		}
		if time.Since(since) >= stall {
			return false, held, true
		}
		// The connection's end is not signalled here: look again now
		// and then.
		if t == nil {
			t = time.NewTimer(250 * time.Millisecond)
		} else {
			t.Reset(250 * time.Millisecond)
		}
		select {
		case <-ch:
			since = time.Now()
		case <-t.C:
		}
	}
}

// watchReceipts samples every connection's receipts each receiptTick
// until stop is closed, and journals what they tell.
func (b *Broker) watchReceipts(stop <-chan struct{}) {
	t := time.NewTicker(receiptTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			b.hook.clients.Range(func(k, v any) bool {
				if upto, ok := v.(*clientInfo).acks.tick(now); ok {
					b.j.Received(k.(*mqtt.Client).ID, upto) // an error is the journal's failure, reported by it
				}
				return true
			})
		}
	}
}

// Live reports whether the connection is open (journal.Connection).
func (w *ackWriter) Live() bool { return !w.cl.Closed() }

var _ journal.Connection = (*ackWriter)(nil)
