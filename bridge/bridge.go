// Package bridge ships the gateway's output (summaries and dead letters) to
// Kafka whenever the uplink is up.
//
// A Forwarder keeps outbound records in a crash-safe queue on disk
// (package queue), bounded by a byte quota, and delivers them in order
// through a Producer; when the link is down it reconnects with capped
// exponential backoff and jitter while the queue absorbs the backlog. The
// delivered position is stored beside the queue after each batch. Delivery
// is at-least-once: a batch whose outcome is unknown is sent again. The
// package knows nothing of MQTT, nor of sarama: records are opaque bytes,
// the Producer is an interface, and package bridge/kafka implements it.
// Package bridge/summary encodes the records' values.
package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/queue"
	"github.com/edgegate/edgegate/bridge/summary"
)

// Header is one Kafka record header.
type Header struct {
	Key, Value string
}

// Record is one Kafka record to deliver.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
}

// Position is how far the outbound queue has been delivered: every record
// below Next of the queue whose identity is Queue.
type Position struct {
	Queue string
	Next  uint64
	// Host and At say where and when a position read from Kafka was
	// written (empty when Kafka does not know: records of older versions).
	Host string
	At   time.Time
}

// Producer delivers batches of records to Kafka. A new one has not taken
// over delivery yet: the Forwarder first reads the position Kafka holds
// (Committed) and checks that its own queue wrote it, then calls
// TakeOver, then reads the position again. Send returns nil only when
// every record of the batch is acknowledged by the brokers, in order per
// key; a transactional producer also records pos in the same transaction.
// After Send fails, the Forwarder closes the producer and connects a new
// one.
type Producer interface {
	// Committed returns the position last committed in Kafka, if the
	// producer records positions there (found is false otherwise),
	// without disturbing another producer that delivers for the same
	// gateway id. After TakeOver, no other producer can move it. A read
	// that failed or timed out is an error, never "nothing delivered":
	// the Forwarder counts it (Stats.PositionErrors) and connects again.
	Committed(ctx context.Context) (pos Position, found bool, err error)
	// TakeOver makes this producer the one that delivers for the
	// gateway: a transactional producer fences every other with the same
	// id (ErrFenced on their next Send) and settles their open
	// transaction.
	TakeOver(ctx context.Context) error
	Send(ctx context.Context, batch []Record, pos Position) error
	Close() error
}

// ErrFenced is what a Producer's Send returns (wrapped) when a
// transactional producer has failed for good: another producer with the
// same transactional id has taken over (another gateway runs with this
// gateway's id), or the brokers refuse this gateway its transactional id.
// Run then stops and returns it.
var ErrFenced = errors.New("fenced: another gateway with the same gateway.id has taken over delivery (or Kafka refuses its transactional id)")

// RefusedError is what a Producer's Send returns (wrapped) when Kafka
// refused records of the batch for good, with an error that sending them
// again cannot cure (MESSAGE_TOO_LARGE, INVALID_RECORD and the like).
// Indexes are the positions in the batch of the refused records, in order;
// Kafka refuses a partition's records of one request together, so not each
// of them is at fault. A transactional producer has delivered nothing of
// the batch. The Forwarder sends the records before the first refused one,
// then that one alone, and sets it aside if Kafka refuses it again.
type RefusedError struct {
	Indexes []int
	Reason  string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("kafka refused %d records of the batch: %s", len(e.Indexes), e.Reason)
}

// Size is the most the record can take in a Kafka record batch (v2), as
// sarama counts it against Producer.MaxMessageBytes: the record's fixed
// overhead at its largest, key, value and each header with its lengths.
func (r *Record) Size() int {
	const recordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1 // sarama's maximumRecordOverhead
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	return n
}

// Warner is a Producer that checked, when it connected, Kafka settings
// delivery depends on, and found some that put it at risk (see package
// bridge/kafka: unclean leader election, min.insync.replicas below 2).
// The Forwarder shows them in Stats.KafkaWarnings.
type Warner interface {
	Warnings() []string
}

// Connector makes a new Producer; it fails when no broker can be reached.
type Connector func(ctx context.Context) (Producer, error)

// Prober checks the link to Kafka without delivering or fencing anything
// (package kafka's Probe: brokers reachable, authentication, topics, the
// transactional id). It returns one line that says what it found, and an
// error when the link cannot be used.
type Prober func(ctx context.Context) (line string, err error)

// LinkState is what the Forwarder knows of its link to Kafka.
type LinkState string

const (
	// LinkConnecting: nothing is known yet (the first check or connection
	// since start has not answered).
	LinkConnecting LinkState = "connecting"
	// LinkUp: the latest batch was delivered (a connection alone does
	// not make the link up), and nothing failed since.
	LinkUp LinkState = "up"
	// LinkIdle: nothing waits to be sent, and the latest check
	// (Options.Probe) found Kafka usable.
	LinkIdle LinkState = "idle"
	// LinkDown: the latest check, connection or send failed
	// (Stats.LinkError says why, Stats.LinkSince since when).
	LinkDown LinkState = "down"
)

// FullPolicy says what happens when the outbound queue reaches its quota.
type FullPolicy int

const (
	// Backpressure: Full reports true once summaries fill 90% of their
	// part of the quota (the quota less the dead letters' share), so the
	// gateway stops acknowledging QoS > 0 readings and devices keep them;
	// summaries of readings already accepted fit in the remaining 10%. A
	// summary is never dropped: beyond the quota it is still written
	// (counted in OverQuota), and only a full disk stops it, which fails
	// the queue (ErrQueueFailed) and stops the process before anything
	// more is acknowledged; the journal still holds the readings.
	Backpressure FullPolicy = iota
	// DropOldest: the oldest undelivered records are dropped to make room
	// for a summary, a segment at a time, and counted.
	DropOldest
)

// Options configures a Forwarder.
type Options struct {
	Gateway         string
	SummariesTopic  string
	DeadletterTopic string
	Dir             string     // directory of the outbound queue
	MaxBytes        int64      // quota of the outbound queue; default 1 GiB
	Policy          FullPolicy // what to do when the quota is reached
	// DeadLetterShare is the part of MaxBytes that dead letters may use,
	// from 0 to 1; default 0.1. A dead letter beyond it (or beyond the
	// quota) is counted and dropped: it never displaces a summary.
	DeadLetterShare float64
	BatchSize       int // at most this many records per Send (one transaction); default 10000
	// MaxBatchBytes caps the records' bytes (Record.Size) of one Send.
	// Within it the size adapts to the link: the first batch is 16 KiB, a
	// batch sent within a second doubles the next, one that took over 4 s
	// or failed halves it. Default 1 MiB.
	MaxBatchBytes int
	// MaxRecordBytes bounds one record (Record.Size); a larger one is set
	// aside without being sent. Keep it below the brokers'
	// message.max.bytes; default 512 KiB.
	MaxRecordBytes int
	// RefusedMaxBytes bounds the store of records set aside (under Dir,
	// in refused/); beyond it the oldest are dropped, counted. Default 16 MiB.
	RefusedMaxBytes  int64
	PositionInterval time.Duration // how often the delivered position is written locally; default 500ms
	SyncInterval     time.Duration // how often appended records are made durable and sent; default 50ms
	MinBackoff       time.Duration // first reconnect delay; default 100ms
	MaxBackoff       time.Duration // reconnect delay cap; default 2s
	Grace            time.Duration // at shutdown, time allowed to deliver what is queued; default 5s
	// Probe checks the link: at start, so that a broker that is down, a
	// wrong password or a missing topic is known before the first window
	// closes, and then every ProbeInterval (default 30s) while nothing
	// waits to be sent and the link is not up (up: when no batch was
	// delivered for 4 intervals). Each probe is bounded by ProbeTimeout
	// (default 20s) and must return soon after its context ends. Nil: a
	// connection made and closed (Connector without TakeOver) is the
	// probe.
	Probe         Prober
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	Logger        *slog.Logger
}

// Stats is a snapshot of the forwarder's counters.
type Stats struct {
	Queued     uint64 // records written to the queue and not yet delivered
	QueueBytes int64
	Enqueued   uint64
	Delivered  uint64
	Batches    uint64 // batches delivered (each one transaction with exactly-once delivery)
	Dropped    uint64 // records dropped to respect the quota
	// DeadLettersDropped counts dead letters not queued, being beyond
	// their share of the quota (Options.DeadLetterShare) or the quota;
	// DeadLetterBytes is what the undelivered dead letters take on disk
	// (those queued since this process started).
	DeadLettersDropped uint64
	DeadLetterBytes    int64
	// OverQuota counts summaries written beyond the quota under
	// Backpressure (rather than dropped).
	OverQuota uint64
	Full      bool // the queue is over its backpressure mark
	// Link is the link's state, LinkSince when it entered it (for
	// LinkDown, the first failure of the spell); LinkUp is Link == LinkUp.
	Link      LinkState
	LinkSince time.Time
	LinkUp    bool
	// LinkChecked is when the link was last found usable or not (a probe,
	// a batch delivered, a connection or send that failed); zero before
	// the first answer.
	LinkChecked time.Time
	Connects    uint64 // successful connections
	SendErrors  uint64
	// PositionErrors counts reads of the delivered position from Kafka
	// that failed or timed out (each followed by a reconnect).
	PositionErrors uint64
	// LinkError is why the link is down: the last failed probe,
	// connection or send (a topic configuration that breaks exactly-once
	// delivery among them); empty unless Link is LinkDown.
	LinkError string
	// Probe is the line of the latest probe (see Options.Probe).
	Probe string
	// KafkaWarnings are the Kafka settings found at the last connection
	// that put delivery at risk (see Warner).
	KafkaWarnings []string
	BatchBytes    int // the size the next batch may take, adapted to the link
	// Refused counts records set aside because Kafka refused them for good
	// or they were over MaxRecordBytes; RefusedBytes is the size of their
	// store, RefusedDropped how many of them were dropped to keep it within
	// RefusedMaxBytes.
	Refused        uint64
	RefusedBytes   int64
	RefusedDropped uint64
	Truncated      int64  // bytes cut from a damaged queue tail at start-up
	Quarantined    int    // damaged queue segments set aside
	Lost           uint64 // records in damaged segments
	// OldestAge is how long the oldest undelivered record has been queued
	// (to a second; records queued before this process started count from
	// its start). Zero when nothing is queued.
	OldestAge time.Duration
}

type enqueueTime struct {
	seq uint64
	at  time.Time
}

// Forwarder keeps outbound records in a crash-safe queue on disk and
// delivers them, in order, through a Producer. Enqueue never blocks on the
// network; Run owns the delivery goroutine.
type Forwarder struct {
	opts    Options
	connect Connector
	log     *slog.Logger
	q       *queue.Log
	refused *queue.Log // records set aside

	mu       sync.Mutex
	stats    Stats
	position uint64    // first record not yet delivered
	saved    time.Time // when the position was last written to disk
	encBuf   []byte
	stored   Mark // mark of the last record enqueued (or found at open)
	// ages notes, at most once a second, the queue sequence enqueued at a
	// wall time, from the delivered position on: the age of the oldest
	// undelivered record, to a second.
	ages   []enqueueTime
	opened time.Time
	// deadSpans note the bytes of undelivered dead letters by range of
	// queue sequence numbers (one span per 1024), so that their share of
	// the quota is known without reading the queue.
	deadSpans []deadSpan
	deadBytes int64

	// Who owns the position Kafka holds (owner.go); Run's goroutine only.
	openNext uint64 // the queue's next sequence number when opened
	owned    bool   // Kafka's position was found to be this queue's, or this queue committed one
	adopting bool   // AdoptFile is there: take over whatever Kafka holds

	// attempts counts the delivery loop's answers from Kafka (connections
	// and sends, good or bad; under mu): a probe that began before the
	// latest one does not overrule it.
	attempts uint64
}

type deadSpan struct {
	last  uint64 // the span's last dead letter
	bytes int64
}

// deadSpanRecords is how many sequence numbers one deadSpan covers.
const deadSpanRecords = 1024

// NewForwarder opens (and recovers) the outbound queue in opts.Dir and
// returns a Forwarder that delivers through producers made by connect.
func NewForwarder(opts Options, connect Connector) (*Forwarder, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 1 << 30
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 10000
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = 1 << 20
	}
	if opts.MaxRecordBytes <= 0 {
		opts.MaxRecordBytes = 512 << 10
	}
	if opts.RefusedMaxBytes <= 0 {
		opts.RefusedMaxBytes = 16 << 20
	}
	if opts.PositionInterval <= 0 {
		opts.PositionInterval = 500 * time.Millisecond
	}
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = 50 * time.Millisecond
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 2 * time.Second
	}
	if opts.Grace <= 0 {
		opts.Grace = 5 * time.Second
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 30 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 20 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DeadLetterShare <= 0 || opts.DeadLetterShare > 1 {
		opts.DeadLetterShare = 0.1
	}
	qmax := opts.MaxBytes
	if opts.Policy == Backpressure {
		qmax = 0 // the forwarder keeps the quota: summaries may go beyond it
	}
	q, err := queue.Open(opts.Dir, queue.Options{
		SegmentBytes: min(16<<20, max(opts.MaxBytes/16, 4096)),
		MaxBytes:     qmax,
		Logger:       opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	refused, err := queue.Open(filepath.Join(opts.Dir, refusedDir), queue.Options{
		SegmentBytes: max(opts.RefusedMaxBytes/4, 4096),
		MaxBytes:     opts.RefusedMaxBytes,
		Logger:       opts.Logger,
	})
	if err != nil {
		q.Close()
		return nil, err
	}
	f := &Forwarder{opts: opts, connect: connect, log: opts.Logger, q: q, refused: refused, opened: time.Now()}
	f.stats.Link, f.stats.LinkSince = LinkConnecting, f.opened
	f.stats.BatchBytes = min(firstBatchBytes, opts.MaxBatchBytes)
	if f.stored, err = lastMark(q); err != nil {
		q.Close()
		refused.Close()
		return nil, err
	}
	qs := q.Stats()
	f.openNext = qs.Next
	if _, err := os.Stat(filepath.Join(opts.Dir, AdoptFile)); err == nil {
		f.adopting = true
		f.log.Warn("outbound queue: "+AdoptFile+" is there: this gateway takes over the delivered position Kafka holds for its id, whoever wrote it",
			"gateway", opts.Gateway, "queue", q.ID())
	}
	f.position = max(q.Position(), qs.First)
	f.stats.Truncated, f.stats.Quarantined, f.stats.Lost = qs.Truncated, qs.Quarantined, qs.Lost
	if qs.Next > f.position {
		f.log.Info("outbound queue recovered", "dir", opts.Dir, "undelivered", qs.Next-f.position, "bytes", qs.Bytes,
			"truncated_bytes", qs.Truncated)
	}
	return f, nil
}

// lastMark reads the mark of the last record in the queue. The record
// before the delivered position is kept on disk for this (see commit).
func lastMark(q *queue.Log) (Mark, error) {
	st := q.Stats()
	if st.Next <= st.First {
		return Mark{}, nil
	}
	r := q.NewReader(st.Next - 1)
	defer r.Close()
	_, data, err := r.Next()
	if err == io.EOF {
		return Mark{}, nil
	}
	if err != nil {
		return Mark{}, fmt.Errorf("read last outbound record: %w", err)
	}
	m, err := recordMark(data)
	if err != nil {
		return Mark{}, nil // counted as lost when the forwarder reads it
	}
	return m, nil
}

// Stored returns the mark of the last record in the queue: what produced
// it, and everything before, is already stored.
func (f *Forwarder) Stored() Mark {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stored
}

// Sync makes every record enqueued so far durable.
func (f *Forwarder) Sync() error {
	if err := f.q.Sync(); err != nil {
		return fmt.Errorf("%w: %w", ErrQueueFailed, err)
	}
	return nil
}

// Summary enqueues a summary record, encoded by package summary: key
// gateway/device, JSON value, the contract's headers. m names what
// produced it (zero for none).
func (f *Forwarder) Summary(s aggregate.Summary, m Mark) {
	f.Enqueue(Record{
		Topic:   f.opts.SummariesTopic,
		Key:     summary.RecordKey(&s),
		Value:   summary.AppendJSON(make([]byte, 0, 384), &s),
		Headers: f.headers(summary.SchemaVersion),
	}, m)
}

// DeadLetter enqueues a dead-letter record, encoded by package summary,
// with this gateway's id, if it fits in the dead letters' share of the
// quota (Options.DeadLetterShare); otherwise it is counted
// (DeadLettersDropped) and dropped. m names what produced it.
func (f *Forwarder) DeadLetter(w summary.DeadLetter, m Mark) {
	w.Gateway = f.opts.Gateway
	f.enqueue(Record{
		Topic:   f.opts.DeadletterTopic,
		Key:     w.RecordKey(),
		Value:   w.AppendJSON(nil),
		Headers: f.headers(summary.DeadLetterSchemaVersion),
	}, m, true)
}

// headers returns the headers of a record the gateway produces (package
// summary names them).
func (f *Forwarder) headers(schema int) []Header {
	return []Header{
		{summary.HeaderGateway, f.opts.Gateway},
		{summary.HeaderSchema, strconv.Itoa(schema)},
		{summary.HeaderContentType, summary.ContentType},
	}
}

// Enqueue writes a record to the queue (durable within SyncInterval, or
// at Sync). m names what produced it. At the quota, under DropOldest the
// oldest segment is dropped and counted; under Backpressure the record is
// written beyond the quota and counted (OverQuota): the gateway stopped
// accepting QoS > 0 readings before that, and what it still makes
// summarises readings it acknowledged.
func (f *Forwarder) Enqueue(r Record, m Mark) { f.enqueue(r, m, false) }

func (f *Forwarder) enqueue(r Record, m Mark, dead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.After(f.stored) {
		f.stored = m // also when dropped: a replay does not make it again
	}
	f.encBuf = encodeRecord(f.encBuf[:0], r, m)
	qs := f.q.Stats()
	f.pruneDead(qs)
	if dead {
		// Frame overhead aside; the share is checked again with the bytes
		// on disk below.
		size := int64(len(f.encBuf))
		if f.deadBytes+size > int64(float64(f.opts.MaxBytes)*f.opts.DeadLetterShare) || qs.Bytes+size > f.opts.MaxBytes {
			f.stats.DeadLettersDropped++
			return
		}
	} else if f.opts.Policy == Backpressure && qs.Bytes+int64(len(f.encBuf)) > f.opts.MaxBytes {
		f.stats.OverQuota++
	}
	for {
		seq, err := f.q.Append(f.encBuf)
		if err == nil {
			f.stats.Enqueued++
			if dead {
				f.noteDead(seq, f.q.Stats().Bytes-qs.Bytes)
			}
			if now := time.Now(); len(f.ages) == 0 || now.Sub(f.ages[len(f.ages)-1].at) >= time.Second {
				f.ages = append(f.ages, enqueueTime{seq, now})
			}
			break
		}
		if errors.Is(err, queue.ErrFull) && !dead {
			n, derr := f.q.DropFirst()
			if derr == nil && n > 0 {
				f.stats.Dropped += n
				f.log.Warn("outbound queue full: oldest records dropped", "records", n, "policy", f.opts.Policy.String())
				continue
			}
		}
		// The queue failed (disk error) or cannot make room: count it as
		// dropped; Run reports the failed queue.
		f.stats.Dropped++
		f.log.Error("outbound record dropped", "topic", r.Topic, "err", err)
		break
	}
}

// noteDead adds a dead letter of n bytes at queue sequence seq.
func (f *Forwarder) noteDead(seq uint64, n int64) {
	f.deadBytes += n
	if k := len(f.deadSpans); k > 0 && f.deadSpans[k-1].last/deadSpanRecords == seq/deadSpanRecords {
		f.deadSpans[k-1].last, f.deadSpans[k-1].bytes = seq, f.deadSpans[k-1].bytes+n
		return
	}
	f.deadSpans = append(f.deadSpans, deadSpan{last: seq, bytes: n})
}

// pruneDead forgets the dead letters delivered or dropped, a span at a
// time (a span counts until its last dead letter is gone).
func (f *Forwarder) pruneDead(qs queue.Stats) {
	first := max(f.position, qs.First)
	i := 0
	for i < len(f.deadSpans) && f.deadSpans[i].last < first {
		f.deadBytes -= f.deadSpans[i].bytes
		i++
	}
	if i > 0 {
		f.deadSpans = append(f.deadSpans[:0], f.deadSpans[i:]...)
	}
}

// Full reports whether the queue is over its backpressure mark under the
// Backpressure policy: summaries (what is not dead letters) fill 90% of
// the quota less the dead letters' share. The gateway then refuses QoS > 0
// readings. It is always false under DropOldest.
func (f *Forwarder) Full() bool {
	if f.opts.Policy != Backpressure {
		return false
	}
	qs := f.q.Stats()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fullLocked(qs)
}

func (f *Forwarder) fullLocked(qs queue.Stats) bool {
	if f.opts.Policy != Backpressure {
		return false
	}
	f.pruneDead(qs)
	share := int64(float64(f.opts.MaxBytes) * f.opts.DeadLetterShare)
	return qs.Bytes-f.deadBytes >= (f.opts.MaxBytes-share)/10*9
}

func (p FullPolicy) String() string {
	if p == DropOldest {
		return "drop_oldest"
	}
	return "backpressure"
}

// Stats returns a snapshot of the counters.
func (f *Forwarder) Stats() Stats {
	qs := f.q.Stats()
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.KafkaWarnings = slices.Clone(s.KafkaWarnings)
	if qs.Next > f.position {
		s.Queued = qs.Next - max(f.position, qs.First)
	}
	s.QueueBytes = qs.Bytes
	s.RefusedBytes = f.refused.Stats().Bytes
	s.Quarantined, s.Lost = qs.Quarantined, qs.Lost
	if s.Queued > 0 {
		// The oldest undelivered record was enqueued at or after the
		// latest note at or below the position (to a second); before the
		// first note, before this process started.
		oldest := f.opened
		for _, a := range f.ages {
			if a.seq > f.position {
				break
			}
			oldest = a.at
		}
		s.OldestAge = time.Since(oldest).Truncate(time.Second)
	}
	s.Full = f.fullLocked(qs)
	s.DeadLetterBytes = f.deadBytes
	return s
}

// connected counts a connection the delivery loop made. It does not make
// the link up: a producer that connects and then fails every send (a
// partition without enough replicas, say) delivers nothing.
func (f *Forwarder) connected() {
	f.mu.Lock()
	f.stats.Connects++
	f.mu.Unlock()
}

// setLink records an answer of the delivery loop: a batch delivered (err
// nil: up), or a connection or send that failed (err set: down).
func (f *Forwarder) setLink(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if err == nil {
		f.moveLink(LinkUp, "", now)
	} else {
		f.moveLink(LinkDown, err.Error(), now)
	}
	f.attempts++
	f.stats.LinkChecked = now
}

// moveLink sets the link's state (under mu); LinkSince moves only when
// the state changes.
func (f *Forwarder) moveLink(to LinkState, why string, now time.Time) {
	if f.stats.Link != to {
		f.stats.LinkSince = now
	}
	f.stats.Link, f.stats.LinkUp, f.stats.LinkError = to, to == LinkUp, why
}

// upProbes is how many ProbeIntervals an up link may go without a batch
// delivered before it is probed: a gateway whose windows close every
// minute delivers more often than that and is never probed, a quiet one
// is, so that a link that broke while nothing was sent shows down.
const upProbes = 4

// probeLoop checks the link at start, then every ProbeInterval while the
// queue is empty and the link not up, or up with no batch delivered for
// upProbes intervals, until ctx ends. While records wait, the delivery
// loop's own connections and sends are the check. It logs the first
// outcome, and every change after it.
//
// The probe must return soon after its context ends: Run waits for it.
func (f *Forwarder) probeLoop(ctx context.Context) {
	probe := f.opts.Probe
	if probe == nil {
		probe = func(ctx context.Context) (string, error) {
			p, err := f.connect(ctx)
			if err != nil {
				return "", err
			}
			p.Close()
			return "kafka reachable (a connection made and closed)", nil
		}
	}
	first := true
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qs := f.q.Stats()
		f.mu.Lock()
		due := qs.Next <= f.position
		if f.stats.Link == LinkUp {
			due = due && time.Since(f.stats.LinkChecked) >= upProbes*f.opts.ProbeInterval
		}
		seen := f.attempts
		f.mu.Unlock()
		if first || due {
			pctx, cancel := context.WithTimeout(ctx, f.opts.ProbeTimeout)
			line, err := probe(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			f.noteProbe(line, err, seen, first)
			first = false
		}
		t.Reset(f.opts.ProbeInterval)
	}
}

// noteProbe records a probe's outcome, unless the delivery loop has had
// an answer from Kafka since the probe began (seen): that one is newer.
// A good probe makes a link that is not up idle when nothing waits; an up
// link stays up.
func (f *Forwarder) noteProbe(line string, err error, seen uint64, first bool) {
	qs := f.q.Stats()
	f.mu.Lock()
	was, wasErr := f.stats.Link, f.stats.LinkError
	if err != nil {
		line = err.Error()
	}
	f.stats.Probe = line
	if f.attempts == seen {
		now := time.Now()
		f.stats.LinkChecked = now
		switch {
		case err != nil:
			why := err.Error()
			if !strings.HasPrefix(why, "kafka probe") {
				why = "probe: " + why
			}
			f.moveLink(LinkDown, why, now)
		case f.stats.Link != LinkUp && qs.Next <= f.position:
			f.moveLink(LinkIdle, "", now)
		}
	}
	now, nowErr := f.stats.Link, f.stats.LinkError
	f.mu.Unlock()
	switch {
	case err != nil && (first || was != now || wasErr != nowErr):
		f.log.Warn("kafka probe failed; readings are still taken and queued", "err", err)
	case err == nil && (first || was != now):
		f.log.Info(line) // "kafka reachable: …", as the Prober says it
	}
}

// ErrQueueFailed wraps a failure of the outbound queue's storage (a failed
// write or fsync). It is fatal: Run returns it and the process should stop.
var ErrQueueFailed = errors.New("outbound queue failed")

// Run delivers queued records until ctx is cancelled, then tries for at most
// Options.Grace to deliver what is left, and closes the queue. It returns
// early only if the queue's storage fails (ErrQueueFailed).
func (f *Forwarder) Run(ctx context.Context) error {
	var p Producer
	pctx, stopProbes := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		f.probeLoop(pctx)
	}()
	defer func() {
		stopProbes()
		<-probed
		if p != nil {
			p.Close()
		}
		f.mu.Lock()
		if f.stats.Link != LinkDown { // a fatal error says why it is down
			f.moveLink(LinkDown, "delivery stopped: the gateway is shutting down", time.Now())
		}
		f.mu.Unlock()
	}()
	backoff := f.opts.MinBackoff
	wait := func(ctx context.Context, d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	nextBackoff := func() time.Duration {
		d := backoff/2 + rand.N(backoff/2+1) // jitter: [backoff/2, backoff]
		backoff = min(2*backoff, f.opts.MaxBackoff)
		return d
	}
	// A batch being sent when ctx is cancelled is not abandoned (it would be
	// sent twice): sends run under sendCtx, which ends Grace after ctx.
	sendCtx, sendCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer sendCancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(f.opts.Grace, sendCancel) })
	defer stopGrace()

	// pending is the batch read from the queue and not yet delivered; it is
	// sent in one or more transactions (see chunk). seqs are the queue
	// positions of its records, pendingNext the position after its last.
	var pending []Record
	var seqs []uint64
	var pendingNext uint64
	// budget is how many bytes of records the next Send may take.
	budget := min(firstBatchBytes, f.opts.MaxBatchBytes)
	setBudget := func(b int) {
		budget = max(min(b, f.opts.MaxBatchBytes), minBatchBytes)
		f.mu.Lock()
		f.stats.BatchBytes = budget
		f.mu.Unlock()
	}
	// suspect is the index in pending of a record Kafka may refuse (it
	// refused a request that held it): the records before it are sent
	// first, then it alone. -1 for none.
	suspect := -1
	nextOf := func(k int) uint64 {
		if k < len(pending) {
			return seqs[k]
		}
		return pendingNext
	}
	// advance drops the first k records of pending (delivered of them)
	// and records the position after them.
	advance := func(k, delivered int, force bool) error {
		next := nextOf(k)
		clear(pending[:k])
		pending, seqs = pending[k:], seqs[k:]
		if suspect >= 0 {
			if suspect -= k; suspect < 0 {
				suspect = -1
			}
		}
		return f.commit(next, delivered, force)
	}

	// While running, a prefetcher reads the next batch while the current
	// one is being sent. At shutdown it stops, and the rest is read in line
	// from the delivered position, so that everything queued before the
	// end is tried within the grace period.
	f.mu.Lock()
	pf := f.startPrefetch(f.position)
	f.mu.Unlock()
	defer func() { pf.stop() }()
	var r *queue.Reader // the in-line reader, at shutdown
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	intern := interner{}
	take := func(b batchOf) error {
		if b.err != nil {
			return b.err
		}
		pending, seqs, pendingNext = b.recs, b.seqs, b.next
		suspect = -1
		if len(pending) == 0 && pendingNext > 0 {
			return f.commit(pendingNext, 0, false) // only undecodable records were read
		}
		return nil
	}
	fill := func() error {
		if len(pending) > 0 {
			return nil
		}
		if r == nil {
			select {
			case b := <-pf.out:
				return take(b)
			default:
				return nil
			}
		}
		return take(f.readBatch(r, intern))
	}
	deliver := func(connectCtx context.Context) (linkErr, fatal error) {
		for {
			if err := fill(); err != nil {
				return nil, err
			}
			if len(pending) == 0 {
				return nil, nil
			}
			if p == nil {
				np, kp, found, linkErr, fatal := f.takeOver(connectCtx)
				if linkErr != nil || fatal != nil {
					return linkErr, fatal
				}
				p = np
				f.mu.Lock()
				if w, ok := np.(Warner); ok {
					f.stats.KafkaWarnings = w.Warnings()
				}
				f.mu.Unlock()
				f.connected()
				f.log.Info("kafka connected")
				if found {
					if skip, err := f.reconcile(kp, seqs[0]); err != nil {
						return nil, err
					} else if skip {
						pending, seqs, suspect = pending[:0], seqs[:0], -1
						if r != nil {
							r.Close()
							r = f.q.NewReader(kp.Next)
						} else {
							pf.stop()
							pf = f.startPrefetch(kp.Next)
						}
						continue
					}
				}
			}
			// A record over the bound is never sent: Kafka would refuse it.
			if n := pending[0].Size(); n > f.opts.MaxRecordBytes {
				if err := f.setAside(pending[0], seqs[0], fmt.Sprintf("record of %d bytes is over kafka.max_record_bytes (%d)", n, f.opts.MaxRecordBytes)); err != nil {
					return nil, err
				}
				if err := advance(1, 0, true); err != nil {
					return nil, err
				}
				continue
			}
			k, size := f.chunk(pending, suspect, budget)
			began := time.Now()
			if err := p.Send(sendCtx, pending[:k], Position{Queue: f.q.ID(), Next: nextOf(k)}); err != nil {
				f.mu.Lock()
				f.stats.SendErrors++
				f.mu.Unlock()
				if errors.Is(err, ErrFenced) {
					f.log.Error("kafka delivery stopped", "err", err)
					return nil, err
				}
				if i, reason, ok := refusedAt(err, k); ok {
					// Nothing of the batch was delivered (the transaction is
					// aborted; without transactions some may have been, and
					// are sent again). A fresh producer starts clean.
					p.Close()
					p = nil
					if k > 1 {
						suspect = i
						f.log.Info("kafka refused records of a batch; sending the first refused one alone", "records", k, "suspect_seq", seqs[i], "err", err)
						continue
					}
					if err := f.setAside(pending[0], seqs[0], reason); err != nil {
						return nil, err
					}
					if err := advance(1, 0, true); err != nil {
						return nil, err
					}
					continue
				}
				p.Close()
				p = nil
				setBudget(budget / 2)
				return fmt.Errorf("send %d records (%d bytes): %w", k, size, err), nil
			}
			if f.adopting {
				if err := f.adopted(); err != nil {
					return nil, fmt.Errorf("%w: %w", ErrQueueFailed, err)
				}
			}
			f.owned = true // Kafka's position is this queue's now
			f.setLink(nil)
			if err := advance(k, k, false); err != nil {
				return nil, err
			}
			// Adapt the next batch to the link: grow while batches that
			// filled their budget go through quickly, shrink after a slow one.
			switch took := time.Since(began); {
			case took > slowSend:
				setBudget(budget / 2)
			case took < fastSend && size >= budget/2:
				setBudget(budget * 2)
			}
			backoff = f.opts.MinBackoff
		}
	}
	tick := time.NewTicker(f.opts.SyncInterval)
	defer tick.Stop()
	for ctx.Err() == nil {
		linkErr, fatal := deliver(ctx)
		if fatal != nil {
			if !errors.Is(fatal, ErrQueueFailed) { // the disk failed, not the link
				f.setLink(fatal)
			}
			// The queue stays open: the gateway's shutdown still queues
			// the summaries of its open windows and syncs them.
			return fatal
		}
		if linkErr != nil && ctx.Err() == nil {
			f.setLink(linkErr)
			f.log.Warn("kafka link down; queueing", "err", linkErr, "queued", f.Stats().Queued)
			wait(ctx, nextBackoff())
			continue
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	// Shutdown: a bounded grace period to deliver what is queued; the rest
	// stays in the queue for the next start. A batch the prefetcher read but
	// that was not sent is read again from the delivered position.
	pf.stop()
	f.mu.Lock()
	if len(pending) == 0 {
		r = f.q.NewReader(f.position)
	} else {
		r = f.q.NewReader(pendingNext)
	}
	f.mu.Unlock()
	for {
		linkErr, fatal := deliver(sendCtx)
		if fatal != nil {
			return fatal
		}
		if linkErr == nil {
			return f.closeQueue()
		}
		if sendCtx.Err() != nil || !wait(sendCtx, nextBackoff()) {
			left := f.Stats().Queued
			f.log.Warn("shutdown: records left in the outbound queue for the next start", "records", left, "err", linkErr)
			return f.closeQueue()
		}
	}
}

// Batch sizes adapt to the link. The first batch is small enough to cross
// a slow link well within the stall timeout (16 KiB of summaries is about
// 6 KB on the wire, 0.3 s at 20 KB/s). A batch that filled its budget and
// went through within fastSend doubles the next (up to MaxBatchBytes); one
// that took longer than slowSend, or failed, halves it (down to
// minBatchBytes; a batch always takes at least one record). In between, a
// batch is a few seconds of the link: a failure resends little, a record
// waits little behind its batch, and a request stays far from the stall
// timeout and sarama's read timeout (10 s).
const (
	firstBatchBytes = 16 << 10
	minBatchBytes   = 4 << 10
	fastSend        = time.Second
	slowSend        = 4 * time.Second
)

// chunk returns how many of the first records of pending the next Send
// takes, and their bytes: at least one, as many as fit in budget bytes,
// none over MaxRecordBytes (the first record is not), and when a suspect
// is known the records before it, or it alone.
func (f *Forwarder) chunk(pending []Record, suspect, budget int) (k, size int) {
	size = pending[0].Size()
	if suspect == 0 {
		return 1, size
	}
	n := len(pending)
	if suspect > 0 {
		n = min(n, suspect)
	}
	for k = 1; k < n; k++ {
		rs := pending[k].Size()
		if rs > f.opts.MaxRecordBytes || size+rs > budget {
			break
		}
		size += rs
	}
	return k, size
}

// refusedAt reports whether err says that Kafka refused records of a
// batch of k for good, the index of the first refused one and why.
func refusedAt(err error, k int) (int, string, bool) {
	var re *RefusedError
	if !errors.As(err, &re) {
		return 0, "", false
	}
	for _, i := range re.Indexes {
		if i >= 0 && i < k {
			return i, re.Reason, true
		}
	}
	return 0, "", false
}

// batchOf is a batch of records read from the queue: first and next are
// the queue positions of its first record and after its last (records that
// could not be decoded are counted and left out).
type batchOf struct {
	recs        []Record
	seqs        []uint64 // queue position of each of recs
	first, next uint64
	err         error
}

// readBatch makes what was appended durable and reads up to BatchSize
// records, or MaxBatchBytes of them. An empty batch with next 0 means
// nothing is queued.
func (f *Forwarder) readBatch(r *queue.Reader, intern interner) batchOf {
	var b batchOf
	if st := f.q.Stats(); st.Next > st.Durable {
		if err := f.q.Sync(); err != nil {
			b.err = fmt.Errorf("%w: %w", ErrQueueFailed, err)
			return b
		}
	}
	bytes := 0
	for len(b.recs) < f.opts.BatchSize && bytes < f.opts.MaxBatchBytes {
		seq, data, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.err = fmt.Errorf("%w: %w", ErrQueueFailed, err)
			return b
		}
		if b.next == 0 {
			b.first = seq
		}
		b.next = seq + 1
		rec, err := decodeRecord(data, intern)
		if err != nil {
			f.mu.Lock()
			f.stats.Lost++
			f.mu.Unlock()
			f.log.Error("outbound record undecodable; skipped", "seq", seq)
			continue
		}
		b.recs = append(b.recs, rec)
		b.seqs = append(b.seqs, seq)
		bytes += rec.Size()
	}
	return b
}

// prefetcher reads batches ahead of delivery in a goroutine of its own.
type prefetcher struct {
	out    chan batchOf
	cancel context.CancelFunc
	done   chan struct{}
}

// startPrefetch starts reading batches from position from, one ahead.
func (f *Forwarder) startPrefetch(from uint64) *prefetcher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prefetcher{out: make(chan batchOf, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		r := f.q.NewReader(from)
		defer r.Close()
		intern := interner{}
		tick := time.NewTicker(f.opts.SyncInterval)
		defer tick.Stop()
		for {
			b := f.readBatch(r, intern)
			if b.next == 0 && b.err == nil { // nothing queued: look again later
				select {
				case <-tick.C:
					continue
				case <-ctx.Done():
					return
				}
			}
			select {
			case p.out <- b:
			case <-ctx.Done():
				return
			}
			if b.err != nil {
				return
			}
		}
	}()
	return p
}

// stop ends the prefetcher and waits for it; a batch it read is dropped.
func (p *prefetcher) stop() {
	p.cancel()
	<-p.done
}

// takeOver connects a producer and makes it the one that delivers for
// the gateway. Before taking over it checks that Kafka's position is this
// queue's (checkOwner), so that a second gateway started with the same id
// stops without fencing the first; after, it reads the position again,
// which no other producer can move now, and checks it again. It returns
// the producer and Kafka's position, a link error (connect again later)
// or a fatal one.
func (f *Forwarder) takeOver(ctx context.Context) (p Producer, kp Position, found bool, linkErr, fatal error) {
	np, err := f.connect(ctx)
	if err != nil {
		return nil, Position{}, false, fmt.Errorf("connect to kafka: %w", err), nil
	}
	committed := func() error {
		if kp, found, err = np.Committed(ctx); err != nil {
			f.mu.Lock()
			f.stats.PositionErrors++
			f.mu.Unlock()
			return fmt.Errorf("read delivered position: %w", err)
		}
		return nil
	}
	if err := committed(); err != nil {
		np.Close()
		return nil, Position{}, false, err, nil
	}
	if err := f.checkOwner(kp, found); err != nil {
		np.Close()
		f.log.Error("kafka delivery stopped", "err", err)
		return nil, Position{}, false, nil, err
	}
	if err := np.TakeOver(ctx); err != nil {
		np.Close()
		return nil, Position{}, false, fmt.Errorf("take over delivery: %w", err), nil
	}
	if err := committed(); err != nil {
		np.Close()
		return nil, Position{}, false, err, nil
	}
	if err := f.checkOwner(kp, found); err != nil {
		np.Close()
		f.log.Error("kafka delivery stopped", "err", err)
		return nil, Position{}, false, nil, err
	}
	return np, kp, found, nil, nil
}

// reconcile compares the position Kafka holds with the pending batch that
// starts at first. It reports skip when Kafka already has (some of) the
// batch, after moving the local position there. A position this queue
// did not write (checkOwner let it through: adopted, or naming no queue)
// says nothing of this queue: the local position counts.
func (f *Forwarder) reconcile(kp Position, first uint64) (skip bool, err error) {
	if kp.Queue != f.q.ID() || f.adopting {
		f.log.Warn("kafka's position is not this queue's to count (another queue wrote it, or it is being adopted); keeping the local position",
			"kafka_queue", kp.Queue, "local_queue", f.q.ID(), "kafka_position", kp.Next, "adopting", f.adopting)
		return false, nil
	}
	if first == 0 || kp.Next <= first {
		return false, nil
	}
	f.log.Info("kafka already holds records of the queue; skipping them", "from", first, "to", kp.Next)
	return true, f.commit(kp.Next, 0, true)
}

// commit records that every record below next was delivered (n records in
// this batch). The position is written to the queue's metadata, and fully
// delivered segments unlinked after it, at most every PositionInterval
// unless force is set: with exactly-once delivery Kafka holds the true
// position, and without it a lost local position only means a few batches
// are sent again (consumers dedupe by id).
func (f *Forwarder) commit(next uint64, n int, force bool) error {
	f.mu.Lock()
	f.position = next
	f.stats.Delivered += uint64(n)
	if n > 0 {
		f.stats.Batches++
	}
	i := 0
	for i+1 < len(f.ages) && f.ages[i+1].seq <= next {
		i++
	}
	f.ages = f.ages[i:]
	due := force || time.Since(f.saved) >= f.opts.PositionInterval
	f.mu.Unlock()
	if !due {
		return nil
	}
	if err := f.q.SetPosition(next); err != nil {
		return fmt.Errorf("%w: %w", ErrQueueFailed, err)
	}
	// The segment holding the last delivered record stays, so that the
	// last record's mark can be read at the next start (Stored) even if
	// the records after it are lost from a torn tail.
	if err := f.q.DropBefore(max(next, 1) - 1); err != nil {
		return fmt.Errorf("%w: %w", ErrQueueFailed, err)
	}
	f.mu.Lock()
	f.saved = time.Now()
	f.mu.Unlock()
	return nil
}

// closeQueue writes the delivered position and closes the queue.
func (f *Forwarder) closeQueue() error {
	f.mu.Lock()
	pos := f.position
	f.mu.Unlock()
	err := f.commit(pos, 0, true)
	if cerr := f.q.Close(); err == nil {
		err = cerr
	}
	if cerr := f.refused.Close(); err == nil {
		err = cerr
	}
	return err
}
