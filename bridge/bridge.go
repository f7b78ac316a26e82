// Package bridge ships the gateway's output (summaries and dead letters) to
// Kafka whenever the uplink is up.
//
// A Forwarder holds outbound records in a bounded buffer and delivers them,
// in order, through a Producer; when the link is down it reconnects with
// capped exponential backoff and jitter while the buffer absorbs the backlog.
// Delivery is at-least-once: a batch whose outcome is unknown is sent again.
// The package knows nothing of MQTT.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/edgegate/edgegate/aggregate"
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

// Producer delivers batches of records to Kafka. Send returns nil only when
// every record of the batch is acknowledged by the brokers, in order per
// key. After Send fails, the Forwarder closes the producer and connects a
// new one.
type Producer interface {
	Send(ctx context.Context, batch []Record) error
	Close() error
}

// Connector makes a new Producer; it fails when no broker can be reached.
type Connector func(ctx context.Context) (Producer, error)

// Options configures a Forwarder.
type Options struct {
	Gateway         string
	SummariesTopic  string
	DeadletterTopic string
	Buffer          int           // records held while the link is down; oldest dropped beyond
	BatchSize       int           // records per Send; default 500
	MinBackoff      time.Duration // first reconnect delay; default 100ms
	MaxBackoff      time.Duration // reconnect delay cap; default 5s
	Grace           time.Duration // at shutdown, time allowed to deliver what is buffered; default 5s
	Logger          *slog.Logger
}

// Stats is a snapshot of the forwarder's counters.
type Stats struct {
	Buffered   int
	Enqueued   uint64
	Delivered  uint64
	Dropped    uint64 // oldest records dropped because the buffer was full
	LinkUp     bool
	Connects   uint64 // successful connections
	SendErrors uint64
}

// Forwarder buffers records and delivers them through a Producer. Enqueue
// never blocks; Run owns the delivery goroutine.
type Forwarder struct {
	opts    Options
	connect Connector
	log     *slog.Logger

	mu     sync.Mutex
	buf    []Record // ring buffer
	head   int
	n      int
	stats  Stats
	notify chan struct{}
}

// NewForwarder returns a Forwarder that delivers through producers made by
// connect.
func NewForwarder(opts Options, connect Connector) *Forwarder {
	if opts.Buffer <= 0 {
		opts.Buffer = 100_000
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 500
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.Grace <= 0 {
		opts.Grace = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Forwarder{
		opts:    opts,
		connect: connect,
		log:     opts.Logger,
		notify:  make(chan struct{}, 1),
	}
}

// Headers returned for every record the gateway produces.
const (
	HeaderGateway     = "edgegate-gateway"
	HeaderSchema      = "edgegate-schema-version"
	HeaderContentType = "content-type"
)

// Summary enqueues a summary record: key gateway/device, JSON value.
func (f *Forwarder) Summary(s aggregate.Summary) {
	f.Enqueue(Record{
		Topic: f.opts.SummariesTopic,
		Key:   s.Key(),
		Value: s.AppendJSON(make([]byte, 0, 384)),
		Headers: []Header{
			{HeaderGateway, f.opts.Gateway},
			{HeaderSchema, strconv.Itoa(aggregate.SchemaVersion)},
			{HeaderContentType, "application/json"},
		},
	})
}

// DeadLetter enqueues a dead-letter record.
func (f *Forwarder) DeadLetter(d DeadLetter) {
	d.Gateway = f.opts.Gateway
	key := f.opts.Gateway
	if d.Device != "" {
		key += "/" + d.Device
	}
	f.Enqueue(Record{
		Topic: f.opts.DeadletterTopic,
		Key:   []byte(key),
		Value: d.AppendJSON(nil),
		Headers: []Header{
			{HeaderGateway, f.opts.Gateway},
			{HeaderSchema, strconv.Itoa(DeadLetterSchemaVersion)},
			{HeaderContentType, "application/json"},
		},
	})
}

// Enqueue adds a record to the buffer. When the buffer is full the oldest
// record is dropped and counted. (A dropped record may have been in a batch
// being sent at the time and still arrive: drops are never under-counted,
// though they can be over-counted by at most one batch.)
func (f *Forwarder) Enqueue(r Record) {
	f.mu.Lock()
	f.stats.Enqueued++
	if f.n == f.opts.Buffer {
		f.buf[f.head] = Record{}
		f.head = (f.head + 1) % len(f.buf)
		f.n--
		f.stats.Dropped++
	}
	if f.n == len(f.buf) {
		f.grow()
	}
	f.buf[(f.head+f.n)%len(f.buf)] = r
	f.n++
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// grow doubles the ring (up to the buffer size), unrolling it.
func (f *Forwarder) grow() {
	nb := make([]Record, min(max(2*len(f.buf), 16), f.opts.Buffer))
	for i := 0; i < f.n; i++ {
		nb[i] = f.buf[(f.head+i)%len(f.buf)]
	}
	f.buf, f.head = nb, 0
}

// peek copies up to max records from the front of the buffer.
func (f *Forwarder) peek(dst []Record, max int) []Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 0; i < f.n && i < max; i++ {
		dst = append(dst, f.buf[(f.head+i)%len(f.buf)])
	}
	return dst
}

// commit removes the first n records after they were delivered. Records
// dropped meanwhile for space reduce n accordingly.
func (f *Forwarder) commit(n int, droppedBefore uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n -= int(f.stats.Dropped - droppedBefore) // already gone from the front
	if n < 0 {
		n = 0
	}
	for i := 0; i < n; i++ {
		f.buf[f.head] = Record{}
		f.head = (f.head + 1) % len(f.buf)
	}
	f.n -= n
	f.stats.Delivered += uint64(n)
}

// Stats returns a snapshot of the counters.
func (f *Forwarder) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.Buffered = f.n
	return s
}

func (f *Forwarder) setLink(up bool) {
	f.mu.Lock()
	f.stats.LinkUp = up
	if up {
		f.stats.Connects++
	}
	f.mu.Unlock()
}

// Run delivers buffered records until ctx is cancelled, then tries for at
// most Options.Grace to deliver what is left. It returns after its producer
// is closed.
func (f *Forwarder) Run(ctx context.Context) error {
	var p Producer
	defer func() {
		if p != nil {
			p.Close()
		}
		f.setLink(false)
	}()
	backoff := f.opts.MinBackoff
	wait := func(ctx context.Context) bool {
		d := backoff/2 + rand.N(backoff/2+1) // jitter: [backoff/2, backoff]
		backoff = min(2*backoff, f.opts.MaxBackoff)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	// A batch being sent when ctx is cancelled is not abandoned (it would be
	// sent twice): sends run under sendCtx, which ends Grace after ctx.
	sendCtx, sendCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer sendCancel()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(f.opts.Grace, sendCancel) })
	defer stopGrace()
	batch := make([]Record, 0, f.opts.BatchSize)
	deliver := func(ctx context.Context) error {
		for {
			f.mu.Lock()
			dropped := f.stats.Dropped
			f.mu.Unlock()
			batch = f.peek(batch[:0], f.opts.BatchSize)
			if len(batch) == 0 {
				return nil
			}
			if p == nil {
				np, err := f.connect(ctx)
				if err != nil {
					return fmt.Errorf("connect to kafka: %w", err)
				}
				p = np
				f.setLink(true)
				f.log.Info("kafka link up")
			}
			if err := p.Send(sendCtx, batch); err != nil {
				f.mu.Lock()
				f.stats.SendErrors++
				f.mu.Unlock()
				p.Close()
				p = nil
				f.setLink(false)
				return fmt.Errorf("send %d records: %w", len(batch), err)
			}
			f.commit(len(batch), dropped)
			clear(batch)
			backoff = f.opts.MinBackoff
		}
	}
	for {
		if err := deliver(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			f.log.Warn("kafka link down; buffering", "err", err, "buffered", f.Stats().Buffered)
			if !wait(ctx) {
				break
			}
			continue
		}
		select {
		case <-ctx.Done():
		case <-f.notify:
			continue
		}
		break
	}
	// Shutdown: a bounded grace period to deliver what is buffered.
	gctx := sendCtx
	for {
		err := deliver(gctx)
		if err == nil {
			return nil
		}
		if gctx.Err() != nil || !wait(gctx) {
			left := f.Stats().Buffered
			f.log.Warn("shutdown: undelivered records discarded", "records", left, "err", err)
			return fmt.Errorf("shutdown with %d records undelivered: %w", left, errors.Join(err, gctx.Err()))
		}
	}
}
