package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgegate/edgegate/bridge/queue"
)

// PendingAck is a PUBACK to send once its publication is durable: To is
// the connection it goes to, as the broker knows it (the journal only
// hands it back).
type PendingAck struct {
	To  any
	PID uint16
	// Seq is the journal sequence of the publication.
	Seq uint64
}

// Journal appends events with group commit: while one batch is written
// and fsynced, the next one fills. Once a batch is durable its waiters are
// released, its PUBACKs handed to the acker and the batch to the applier,
// which applies batches in journal order. Acknowledgements therefore never
// wait for the aggregator (a checkpoint holds it for a while); a reading
// shows in the counters shortly after its PUBACK. If the applier falls
// 1024 batches behind (about a second at full load), the flusher waits for
// it: backpressure. Run owns the flushing goroutine, the acker and the
// applier.
type Journal struct {
	log      *queue.Log
	interval time.Duration // minimum time between fsyncs (storage.fsync_interval)
	now      func() time.Time
	mono     func() time.Duration // nil: records carry no monotonic time
	apply    func(first uint64, recs [][]byte)
	ack      func([]PendingAck)
	acks     chan []PendingAck
	applyq   chan applyBatch

	mu  sync.Mutex
	cur *Batch
	// writing is the size of the batch being written and fsynced;
	// maxPending bounds it and the current batch together: publications
	// wait (their clients' sockets are not read) while they are over it.
	writing    int
	maxPending int
	drained    *sync.Cond // on mu: writing ended, or the journal failed
	waits      atomic.Uint64
	wake       chan struct{}
	err        error       // sticky: the log failed, or Run ended
	clock      *ClockState // to journal before the next event (SetClock)
	start      int         // where the event being appended begins in cur.buf
	at         int64       // its monotonic time

	written atomic.Int64 // bytes appended since the journal was opened
	fsync   latencyHistogram
}

// applyBatch is a durable batch on its way to the applier.
type applyBatch struct {
	first uint64
	recs  [][]byte
}

// Batch is the group of events written and fsynced together. Wait
// returns once it is durable.
type Batch struct {
	buf   []byte
	ends  []int
	acks  []PendingAck // Seq: the record's index in the batch until it is written
	first uint64       // sequence of the first record, once written
	done  chan struct{}
	err   error
}

// ErrJournalClosed is returned for events submitted after the journal
// stopped.
var ErrJournalClosed = errors.New("ingest journal closed")

// Options configures a Journal.
type Options struct {
	// Interval is the least time between two fsyncs
	// (storage.fsync_interval); zero syncs as soon as events come.
	Interval time.Duration
	// Now is the wall clock that stamps events (time.Now if nil).
	Now func() time.Time
	// Mono, if set, is the monotonic clock (time since boot) that stamps
	// every event too; see SetClock.
	Mono func() time.Duration
	// Apply is given each durable batch, in journal order, from the
	// applier goroutine.
	Apply func(first uint64, recs [][]byte)
	// Ack is given the PUBACKs of each durable batch, from the acker
	// goroutine.
	Ack func([]PendingAck)
	// MaxPending bounds the bytes of publications waiting to be written
	// and fsynced (DefaultMaxPending if 0): while a slow card holds an
	// fsync, QoS 0 publications, which nobody waits for, would otherwise
	// pile up in memory.
	MaxPending int
}

// DefaultMaxPending is 8 MiB: 32 packets of mqtt.max_packet_bytes, and far
// more than a card writes in one fsync interval.
const DefaultMaxPending = 8 << 20

// New returns a journal that appends to l. Nothing is written until Run.
func New(l *queue.Log, o Options) *Journal {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Ack == nil {
		o.Ack = func([]PendingAck) {}
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	j := &Journal{log: l, interval: o.Interval, now: o.Now, mono: o.Mono, apply: o.Apply, ack: o.Ack, cur: newBatch(), wake: make(chan struct{}, 1),
		acks: make(chan []PendingAck, 4), applyq: make(chan applyBatch, 1024), maxPending: o.MaxPending}
	j.drained = sync.NewCond(&j.mu)
	return j
}

// PendingWaits counts publications that waited because MaxPending bytes
// were waiting for the card.
func (j *Journal) PendingWaits() uint64 { return j.waits.Load() }

// Pending returns the bytes journaled and not yet durable.
func (j *Journal) Pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.writing + len(j.cur.buf)
}

// Written returns the bytes appended since the journal was opened.
func (j *Journal) Written() int64 { return j.written.Load() }

// FsyncLatency returns the histogram of the journal's fsync durations.
func (j *Journal) FsyncLatency() Histogram { return j.fsync.snapshot() }

func newBatch() *Batch { return &Batch{done: make(chan struct{})} }

// begin locks the journal for one append and returns the batch to write
// into, and the event's wall time. Times are taken under the lock, so the
// monotonic ones never go backwards in journal order (the wall clock may,
// when it is stepped). A clock state given to SetClock is journaled first.
func (j *Journal) begin() (*Batch, int64, error) {
	j.mu.Lock()
	return j.beginLocked()
}

// beginLocked is begin with the lock taken.
func (j *Journal) beginLocked() (*Batch, int64, error) {
	if j.err != nil {
		err := j.err
		j.mu.Unlock()
		return nil, 0, err
	}
	b, at := j.cur, j.now().UnixNano()
	if j.mono != nil {
		j.at = int64(j.mono())
	}
	if c := j.clock; c != nil {
		j.clock = nil
		j.start = len(b.buf)
		b.buf = appendClockState(b.buf, at, *c)
		j.stamp(b)
	}
	j.start = len(b.buf)
	return b, at, nil
}

// beginPublish is begin for a publication: it first waits while
// MaxPending bytes wait for the card (the publisher's socket is not read
// meanwhile), then, without letting the lock go (so that publishers woken
// together do not all append past the bound), refuses the publication if
// its connection ended meanwhile. Other events are small and never wait.
func (j *Journal) beginPublish(from any) (*Batch, int64, error) {
	j.mu.Lock()
	if j.err == nil && j.writing+len(j.cur.buf) >= j.maxPending {
		j.waits.Add(1)
		for j.err == nil && j.writing+len(j.cur.buf) >= j.maxPending {
			j.drained.Wait()
		}
	}
	if c, ok := from.(Connection); ok && !c.Live() {
		j.mu.Unlock()
		return nil, 0, ErrConnectionEnded
	}
	return j.beginLocked()
}

// Connection is what a publication's ackTo may be: the connection it came
// on. A publication whose connection ended before it is journaled is
// refused (ErrConnectionEnded), under the journal's lock: the client
// resends it on its next connection, whose session start (journaled after
// this one ended) would otherwise come before it, and duplicate detection
// would take the two for different publications.
type Connection interface{ Live() bool }

// ErrConnectionEnded is returned by Publish for a publication whose
// connection ended before it was journaled.
var ErrConnectionEnded = errors.New("connection ended before the publication was journaled")

// stamp ends the record that begins at j.start, with its monotonic time.
func (j *Journal) stamp(b *Batch) {
	if j.mono != nil {
		b.buf = stampMono(b.buf, j.start, j.at)
	}
	b.ends = append(b.ends, len(b.buf))
}

// SetClock journals c before the next event: the boot its monotonic times
// count from and the wall clock's synchronization. Call it before the
// first event, and whenever the state changes; an idle gateway writes
// nothing until its next event.
func (j *Journal) SetClock(c ClockState) {
	j.mu.Lock()
	j.clock = &c
	j.mu.Unlock()
}

// end finishes the append begun with begin and wakes the flusher.
func (j *Journal) end(b *Batch) {
	j.stamp(b)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Publish journals a publication from client, whose readings may name
// device only (empty: any). With ack set, a PUBACK for it is handed to
// the Ack function, addressed to ackTo, once it is durable. It returns
// the batch, whose Wait returns once the batch is durable, and the
// publication's index in it (Batch.Seq).
func (j *Journal) Publish(client, device string, ackTo any, flags byte, pid uint16, topic string, payload []byte, ack bool) (*Batch, int, error) {
	b, at, err := j.beginPublish(ackTo)
	if err != nil {
		return nil, 0, err
	}
	i := len(b.ends)
	b.buf = AppendPublishAs(b.buf, at, flags, pid, client, device, topic, payload)
	if ack {
		b.acks = append(b.acks, PendingAck{ackTo, pid, uint64(i)})
	}
	j.end(b)
	return b, i, nil
}

// Received journals that client has received the acknowledgements of its
// publications journaled up to sequence upto (see Dedupe).
func (j *Journal) Received(client string, upto uint64) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendReceived(b, at, client, upto) })
	return err
}

// event journals one record that appendTo writes at the end of the
// current batch, given the event time. Publications from clients have
// their own, allocation-free path (Publish).
func (j *Journal) event(appendTo func(b []byte, at int64) []byte) (*Batch, error) {
	b, at, err := j.begin()
	if err != nil {
		return nil, err
	}
	b.buf = appendTo(b.buf, at)
	j.end(b)
	return b, nil
}

// Local journals a publication the gateway makes itself (its own
// sensors), as QoS 0 from client.
func (j *Journal) Local(client, topic string, payload []byte) error {
	_, err := j.event(func(b []byte, at int64) []byte {
		return AppendPublish(b, at, FlagLocal, 0, client, topic, payload)
	})
	return err
}

// Clock journals a tick or the shutdown flush.
func (j *Journal) Clock(kind byte) (*Batch, error) {
	return j.event(func(b []byte, at int64) []byte { return appendClock(b, kind, at) })
}

// SessionStart journals that client has a persistent session s.
func (j *Journal) SessionStart(client string, s Session) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSessionStart(b, at, client, s) })
	return err
}

// SessionEnd journals the end of client's session (and of its duplicate
// detection, subscriptions and QoS 2 exchanges).
func (j *Journal) SessionEnd(client string) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSessionEnd(b, at, client) })
	return err
}

// Subscribe journals a subscription of client to filter.
func (j *Journal) Subscribe(client, filter string, s Subscription) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendSubscribe(b, at, client, filter, s) })
	return err
}

// Unsubscribe journals the end of a subscription.
func (j *Journal) Unsubscribe(client, filter string) error {
	_, err := j.event(func(b []byte, at int64) []byte { return appendUnsubscribe(b, at, client, filter) })
	return err
}

// Pubrel journals that a QoS 2 exchange the client began is complete. It
// returns the batch: the PUBCOMP may be sent once it is durable.
func (j *Journal) Pubrel(client string, pid uint16) (*Batch, error) {
	return j.event(func(b []byte, at int64) []byte { return appendPubrel(b, at, client, pid) })
}

// Wait blocks until b is durable.
func (b *Batch) Wait() error {
	<-b.done
	return b.err
}

// Seq returns the journal sequence of the batch's record i; valid once
// Wait returned nil.
func (b *Batch) Seq(i int) uint64 { return b.first + uint64(i) }

// Run writes batches until ctx is cancelled, then writes and applies what
// is pending and returns. A failed write or fsync ends it with the error:
// nothing more is acknowledged, and every waiter gets the error.
func (j *Journal) Run(ctx context.Context) error {
	ackDone, applyDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ackDone)
		for acks := range j.acks {
			j.ack(acks)
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
func (j *Journal) fail(err error) {
	j.mu.Lock()
	if j.err == nil {
		j.err = err
	}
	b := j.cur
	j.cur = newBatch()
	j.drained.Broadcast()
	j.mu.Unlock()
	if len(b.ends) > 0 {
		b.err = err
		close(b.done)
	}
}

func (j *Journal) flush() error {
	j.mu.Lock()
	b := j.cur
	if len(b.ends) == 0 {
		j.mu.Unlock()
		return nil
	}
	j.cur = newBatch()
	j.writing = len(b.buf)
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		j.writing = 0
		j.drained.Broadcast()
		j.mu.Unlock()
	}()
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
	b.first = first
	for i := range b.acks {
		b.acks[i].Seq += first
	}
	close(b.done)
	if len(b.acks) > 0 {
		j.acks <- b.acks
	}
	j.applyq <- applyBatch{first, recs}
	return nil
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
