package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/edgegate/edgegate/bridge/queue"
)

// The ingest journal is a queue.Log in <data_dir>/ingest holding every
// event that changes the gateway's state, in the order it is applied:
// publications, the idle-close tick, the shutdown flush and MQTT sessions
// beginning and ending. Events are applied to the aggregator only after
// they are durable, so replaying the journal from a checkpoint rebuilds
// exactly the state, and the outputs, that the first run had. JOURNAL.md
// gives the record layout.
const (
	evPublish      byte = 'P'
	evTick         byte = 'T'
	evFlush        byte = 'F'
	evSessionStart byte = 'S'
	evSessionEnd   byte = 'E'
	evPubrel       byte = 'R'
	evSubscribe    byte = 'B'
	evUnsubscribe  byte = 'N'
)

// Publication flags in a publish event.
const (
	flagQoSMask = 0x03
	flagDup     = 0x04
	flagRetain  = 0x08
)

// event is a decoded journal record. Byte slices alias the record.
type event struct {
	kind    byte
	at      int64 // wall clock, Unix nanoseconds
	flags   byte
	pid     uint16
	client  []byte
	topic   []byte
	payload []byte
	sess    session
	sub     subscription
}

// session is what the journal keeps of a persistent MQTT session, enough
// for mochi to restore it (so that CONNACK says the session is present).
type session struct {
	proto    byte
	expiry   uint32 // session expiry interval, seconds
	username string
	listener string
}

var errEvent = errors.New("undecodable journal record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPublish(b []byte, at int64, flags byte, pid uint16, client, topic string, payload []byte) []byte {
	b = append(b, evPublish)
	b = binary.AppendVarint(b, at)
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(pid))
	b = appendString(b, client)
	b = appendString(b, topic)
	return append(b, payload...)
}

func appendClock(b []byte, kind byte, at int64) []byte {
	b = append(b, kind)
	return binary.AppendVarint(b, at)
}

func appendSessionStart(b []byte, at int64, client string, s session) []byte {
	b = appendClock(b, evSessionStart, at)
	b = appendString(b, client)
	b = append(b, s.proto)
	b = binary.AppendUvarint(b, uint64(s.expiry))
	b = appendString(b, s.username)
	return appendString(b, s.listener)
}

func appendSessionEnd(b []byte, at int64, client string) []byte {
	b = appendClock(b, evSessionEnd, at)
	return appendString(b, client)
}

// subscription is what the journal keeps of a persistent session's
// subscription (mochi's storage.Subscription, without the id).
type subscription struct {
	qos, retainHandling      byte
	noLocal, retainAsPublish bool
	identifier               int
}

func (s subscription) flags() byte {
	f := s.qos&3 | s.retainHandling&3<<2
	if s.noLocal {
		f |= 1 << 4
	}
	if s.retainAsPublish {
		f |= 1 << 5
	}
	return f
}

func subscriptionOf(flags byte, identifier int) subscription {
	return subscription{qos: flags & 3, retainHandling: flags >> 2 & 3, noLocal: flags&(1<<4) != 0, retainAsPublish: flags&(1<<5) != 0, identifier: identifier}
}

func appendSubscribe(b []byte, at int64, client, filter string, s subscription) []byte {
	b = appendClock(b, evSubscribe, at)
	b = appendString(b, client)
	b = appendString(b, filter)
	b = append(b, s.flags())
	return binary.AppendUvarint(b, uint64(s.identifier))
}

func appendUnsubscribe(b []byte, at int64, client, filter string) []byte {
	b = appendClock(b, evUnsubscribe, at)
	b = appendString(b, client)
	return appendString(b, filter)
}

func appendPubrel(b []byte, at int64, client string, pid uint16) []byte {
	b = appendClock(b, evPubrel, at)
	b = appendString(b, client)
	return binary.AppendUvarint(b, uint64(pid))
}

// reader decodes the fields of one record.
type reader struct {
	b  []byte
	ok bool
}

func (r *reader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) varint() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.ok = false
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if !r.ok || n > uint64(len(r.b)) {
		r.ok = false
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func decodeEvent(rec []byte) (event, error) {
	r := reader{b: rec, ok: true}
	e := event{kind: r.byte()}
	e.at = r.varint()
	switch e.kind {
	case evPublish:
		e.flags = r.byte()
		pid := r.uvarint()
		if pid > 0xffff {
			r.ok = false
		}
		e.pid = uint16(pid)
		e.client = r.bytes()
		e.topic = r.bytes()
		e.payload = r.b
		r.b = nil
	case evTick, evFlush:
	case evSessionStart:
		e.client = r.bytes()
		e.sess.proto = r.byte()
		exp := r.uvarint()
		if exp > 1<<32-1 {
			r.ok = false
		}
		e.sess.expiry = uint32(exp)
		e.sess.username = string(r.bytes())
		e.sess.listener = string(r.bytes())
	case evSessionEnd:
		e.client = r.bytes()
	case evSubscribe:
		e.client = r.bytes()
		e.topic = r.bytes()
		flags := r.byte()
		id := r.uvarint()
		if id > 1<<28 {
			r.ok = false
		}
		e.sub = subscriptionOf(flags, int(id))
	case evUnsubscribe:
		e.client = r.bytes()
		e.topic = r.bytes()
	case evPubrel:
		e.client = r.bytes()
		pid := r.uvarint()
		if pid > 0xffff {
			r.ok = false
		}
		e.pid = uint16(pid)
	default:
		r.ok = false
	}
	if !r.ok || len(r.b) != 0 {
		return event{}, errEvent
	}
	return e, nil
}

// pendingAck is a PUBACK to send once its publication is durable.
type pendingAck struct {
	cl  *mqtt.Client
	pid uint16
}

// journal appends events with group commit: while one batch is written
// and fsynced, the next one fills. Once a batch is durable its waiters are
// released, its PUBACKs handed to the acker and the batch to the applier,
// which applies batches in journal order. Acknowledgements therefore never
// wait for the aggregator (a checkpoint holds it for a while); a reading
// shows in the counters shortly after its PUBACK. If the applier falls
// 1024 batches behind (about a second at full load), the flusher waits for
// it: backpressure. Run owns the
// flushing goroutine, the acker and the applier.
type journal struct {
	log      *queue.Log
	interval time.Duration // minimum time between fsyncs (storage.fsync_interval)
	now      func() time.Time
	apply    func(first uint64, recs [][]byte)
	acks     chan []pendingAck
	applyq   chan applyBatch

	mu   sync.Mutex
	cur  *jbatch
	wake chan struct{}
	err  error // sticky: the log failed, or Run ended

	written atomic.Int64 // bytes appended since the journal was opened
	fsync   latencyHistogram
}

// applyBatch is a durable batch on its way to the applier.
type applyBatch struct {
	first uint64
	recs  [][]byte
}

type jbatch struct {
	buf  []byte
	ends []int
	acks []pendingAck
	done chan struct{}
	err  error
}

// ErrJournalClosed is returned for events submitted after the journal
// stopped.
var ErrJournalClosed = errors.New("ingest journal closed")

func newJournal(l *queue.Log, interval time.Duration, now func() time.Time, apply func(uint64, [][]byte)) *journal {
	return &journal{log: l, interval: interval, now: now, apply: apply, cur: newBatch(), wake: make(chan struct{}, 1),
		acks: make(chan []pendingAck, 4), applyq: make(chan applyBatch, 1024)}
}

func newBatch() *jbatch { return &jbatch{done: make(chan struct{})} }

// begin locks the journal for one append and returns the batch to write
// into, and the event time: taken under the lock, so times never go
// backwards in journal order.
func (j *journal) begin() (*jbatch, int64, error) {
	j.mu.Lock()
	if j.err != nil {
		err := j.err
		j.mu.Unlock()
		return nil, 0, err
	}
	return j.cur, j.now().UnixNano(), nil
}

// end finishes the append begun with begin and wakes the flusher.
func (j *journal) end(b *jbatch) {
	b.ends = append(b.ends, len(b.buf))
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// publish journals a publication. With ack set, a PUBACK for it is sent to
// cl once it is durable. It returns the batch, whose done channel closes
// when the batch is durable (check its err then).
func (j *journal) publish(cl *mqtt.Client, flags byte, pid uint16, topic string, payload []byte, ack bool) (*jbatch, error) {
	b, at, err := j.begin()
	if err != nil {
		return nil, err
	}
	b.buf = appendPublish(b.buf, at, flags, pid, cl.ID, topic, payload)
	if ack {
		b.acks = append(b.acks, pendingAck{cl, pid})
	}
	j.end(b)
	return b, nil
}

// event journals one record that appendTo writes at the end of the
// current batch, given the event time. Publications from clients have
// their own, allocation-free path (publish).
func (j *journal) event(appendTo func(b []byte, at int64) []byte) (*jbatch, error) {
	b, at, err := j.begin()
	if err != nil {
		return nil, err
	}
	b.buf = appendTo(b.buf, at)
	j.end(b)
	return b, nil
}

// local journals a publication the gateway makes itself (its own
// sensors), as QoS 0 from client.
func (j *journal) local(client, topic string, payload []byte) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendPublish(b, at, 0, 0, client, topic, payload) })
	return err
}

// clock journals a tick or the shutdown flush.
func (j *journal) clock(kind byte) (*jbatch, error) {
	return j.event(func(b []byte, at int64) []byte { return appendClock(b, kind, at) })
}

func (j *journal) sessionStart(client string, s session) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSessionStart(b, at, client, s) })
	return err
}

func (j *journal) sessionEnd(client string) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSessionEnd(b, at, client) })
	return err
}

// subscribe journals a subscription of client to filter.
func (j *journal) subscribe(client, filter string, s subscription) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSubscribe(b, at, client, filter, s) })
	return err
}

// unsubscribe journals the end of a subscription.
func (j *journal) unsubscribe(client, filter string) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendUnsubscribe(b, at, client, filter) })
	return err
}

// pubrel journals that a QoS 2 exchange the client began is complete.
func (j *journal) pubrel(client string, pid uint16) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendPubrel(b, at, client, pid) })
	return err
}

// wait blocks until b is durable.
func (b *jbatch) wait() error {
	<-b.done
	return b.err
}

// Run writes batches until ctx is cancelled, then writes and applies what
// is pending and returns. A failed write or fsync ends it with the error:
// nothing more is acknowledged, and every waiter gets the error.
func (j *journal) Run(ctx context.Context) error {
	ackDone, applyDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ackDone)
		for acks := range j.acks {
			writeAcks(acks)
		}
	}()
	go func() {
		defer close(applyDone)
		for b := range j.applyq {
			j.apply(b.first, b.recs)
		}
	}()
	defer func() {
		close(j.acks)
		close(j.applyq)
		<-ackDone
		<-applyDone
	}()
	var last time.Time // when the latest flush began
	for {
		select {
		case <-j.wake:
			// At most one fsync per interval: on an SD card every fsync
			// rewrites at least a block and a filesystem journal commit,
			// whatever the few readings it carries.
			if wait := j.interval - time.Since(last); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done(): // flush now; the loop sees ctx next
					t.Stop()
				}
			}
			last = time.Now()
			if err := j.flush(); err != nil {
				j.fail(err)
				return err
			}
		case <-ctx.Done():
			err := j.flush()
			if err == nil {
				err = ErrJournalClosed
			}
			j.fail(err)
			if errors.Is(err, ErrJournalClosed) {
				return nil
			}
			return err
		}
	}
}

// fail makes err sticky and releases a batch that raced in after the last
// flush.
func (j *journal) fail(err error) {
	j.mu.Lock()
	if j.err == nil {
		j.err = err
	}
	b := j.cur
	j.cur = newBatch()
	j.mu.Unlock()
	if len(b.ends) > 0 {
		b.err = err
		close(b.done)
	}
}

func (j *journal) flush() error {
	j.mu.Lock()
	b := j.cur
	if len(b.ends) == 0 {
		j.mu.Unlock()
		return nil
	}
	j.cur = newBatch()
	j.mu.Unlock()
	recs := make([][]byte, len(b.ends))
	start := 0
	for i, end := range b.ends {
		recs[i] = b.buf[start:end:end]
		start = end
	}
	first, err := j.log.Append(recs...)
	if err == nil {
		t0 := time.Now()
		err = j.log.Sync()
		j.fsync.observe(time.Since(t0))
	}
	if err != nil {
		err = fmt.Errorf("ingest journal: %w", err)
		b.err = err
		close(b.done)
		return err
	}
	j.written.Add(int64(len(b.buf)))
	close(b.done)
	if len(b.acks) > 0 {
		j.acks <- b.acks
	}
	j.applyq <- applyBatch{first, recs}
	return nil
}

// writeAcks sends PUBACKs, one write per client for a batch. A PUBACK with
// reason Success and no properties is four bytes in MQTT 3.1.1 and 5
// alike. The write is made under the client's lock, as mochi's own writes
// are, with a deadline so that one client that stopped reading cannot hold
// up the others; such a client is disconnected (its unacknowledged
// publications are resent on reconnect and recognised as duplicates).
func writeAcks(acks []pendingAck) {
	byClient := map[*mqtt.Client][]byte{}
	var order []*mqtt.Client
	for _, a := range acks {
		b, ok := byClient[a.cl]
		if !ok {
			order = append(order, a.cl)
		}
		byClient[a.cl] = append(b, 0x40, 0x02, byte(a.pid>>8), byte(a.pid))
	}
	for _, cl := range order {
		if err := writeRaw(cl, byClient[cl]); err != nil {
			cl.Stop(fmt.Errorf("write puback: %w", err))
		}
	}
}

func writeRaw(cl *mqtt.Client, b []byte) error {
	cl.Lock()
	defer cl.Unlock()
	if cl.Closed() || cl.Net.Conn == nil {
		return nil // gone: the client resends on reconnect
	}
	conn := cl.Net.Conn
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := conn.Write(b)
	conn.SetWriteDeadline(time.Time{})
	return err
}

// fsyncBounds are the upper bounds of the fsync latency buckets, in
// seconds: an SD card's fsync takes from under a millisecond to hundreds.
var fsyncBounds = [...]float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// latencyHistogram counts durations in fsyncBounds buckets, lock-free.
type latencyHistogram struct {
	buckets [len(fsyncBounds) + 1]atomic.Uint64 // the last is +Inf
	sumNs   atomic.Int64
}

func (h *latencyHistogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(fsyncBounds) && s > fsyncBounds[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.sumNs.Add(int64(d))
}

// Histogram is a snapshot of a latency histogram: Counts[i] is the number
// of observations at most Bounds[i] seconds (cumulative, as Prometheus
// has them); Count includes those above the last bound.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64 // seconds
}

func (h *latencyHistogram) snapshot() Histogram {
	out := Histogram{Bounds: fsyncBounds[:], Counts: make([]uint64, len(fsyncBounds)), Sum: time.Duration(h.sumNs.Load()).Seconds()}
	var cum uint64
	for i := range h.buckets {
		cum += h.buckets[i].Load()
		if i < len(fsyncBounds) {
			out.Counts[i] = cum
		}
	}
	out.Count = cum
	return out
}
