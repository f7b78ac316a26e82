// Package kafka is the Kafka side of the bridge, on IBM/sarama: the
// producer that package bridge's Forwarder delivers through (NewConnector;
// idempotent, optionally transactional, with the delivered position kept
// in a compacted offsets topic and read back to its partition's end,
// position.go), the topic settings exactly-once delivery depends on,
// checked at each connection (topics.go), TLS and SASL set-up with errors
// that say what to check, and one read_committed consumer of every
// partition of a topic (Read) for the programs and tests that read the
// records back.
//
// sarama records metrics in go-metrics, whose meters tick in a goroutine
// that never stops; a command that links this package calls
// DisableMetrics first thing in main (library packages have no init).
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge"
)

// Options configures the sarama producer.
type Options struct {
	Brokers  []string
	ClientID string
	// TransactionalID, when set, makes delivery exactly-once: each batch is
	// written in a Kafka transaction together with the gateway's delivered
	// position, which is stored under PositionKey in OffsetsTopic (a
	// compacted topic). A second producer with the same id fences this one.
	TransactionalID string
	OffsetsTopic    string
	PositionKey     string
	// StallTimeout abandons a batch (or a commit) when no byte has moved
	// between the producer and the brokers for this long (default 10s): a
	// link that went silent without a reset is then replaced by a fresh
	// producer instead of waiting out sarama's retries and circuit breaker.
	// A slow link whose bytes keep moving is not a stall, however long the
	// batch takes. It is also sarama's read and write timeout of a request.
	// Outages that reset connections are ridden out by sarama's own retries
	// (the outage test resumes in under a second).
	StallTimeout time.Duration
	// MaxRecordBytes is sarama's Producer.MaxMessageBytes: the largest
	// record (bridge.Record.Size) and the most one partition's records
	// take in one request (default 512 KiB). Keep it below the brokers'
	// message.max.bytes; the Forwarder sets larger records aside.
	MaxRecordBytes int
	// DataTopics are the topics the batches go to (summaries, dead
	// letters). At each connection their settings, and the offsets
	// topic's, are checked (see checkTopics).
	DataTopics []string
	// Logger gets the warnings of those checks, each once per connector;
	// nil discards them.
	Logger *slog.Logger
	// TLS, if set, encrypts the connections to the brokers.
	TLS *tls.Config
	// SASL, if set, authenticates to the brokers.
	SASL *SASL
}

// SaramaConfig returns the producer configuration: idempotent (so retries
// never duplicate or reorder within a partition), acks from all in-sync
// replicas, zstd compression, and enough retries with capped exponential
// backoff to ride out a broker restart without failing the batch.
func SaramaConfig(o Options) *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = o.ClientID
	c.Version = sarama.V2_8_0_0 // idempotence needs 0.11, zstd 2.1
	c.Net.MaxOpenRequests = 1   // required by idempotence
	c.Net.DialTimeout = 5 * time.Second
	c.Net.ReadTimeout = stallTimeout(o)
	c.Net.WriteTimeout = stallTimeout(o)
	c.Metadata.Retry.Max = 3
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Compression = sarama.CompressionZSTD
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Retry.Max = 20
	c.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return min(100*time.Millisecond<<min(retries, 5), 2*time.Second)
	}
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	c.Producer.Flush.MaxMessages = 0
	c.Producer.MaxMessageBytes = 512 << 10
	if o.MaxRecordBytes > 0 {
		c.Producer.MaxMessageBytes = o.MaxRecordBytes
	}
	c.Producer.Partitioner = sarama.NewHashPartitioner // key = gateway/device: one partition per device
	if o.TransactionalID != "" {
		c.Producer.Transaction.ID = o.TransactionalID
		c.Producer.Transaction.Timeout = 60 * time.Second
		c.Producer.Transaction.Retry.Max = 5
		c.Producer.Transaction.Retry.BackoffFunc = c.Producer.Retry.BackoffFunc
		c.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	applySecurity(c, o)
	return c
}

func stallTimeout(o Options) time.Duration {
	if o.StallTimeout > 0 {
		return o.StallTimeout
	}
	return 10 * time.Second
}

// NewConnector returns a bridge.Connector. Each connection is a client
// of the brokers (its metadata fetched, so the link is up) and a producer
// that has not taken over delivery yet: Committed reads the gateway's
// position without disturbing any other producer, and TakeOver makes the
// sarama async producer (for a transactional one, InitProducerId, which
// fences every other producer with the same transactional id). A
// connection attempt that ctx ends is abandoned (a client or producer
// made after that is closed); a failure to reach any broker is explained
// (see the kafka.tls and kafka.sasl configuration keys it names).
//
// The connector makes one producer at a time: a transactional producer's
// initialisation fences every producer made before it, and an abandoned
// attempt goes on initialising in the background. Were the next attempt
// to overtake it, the abandoned one would fence the producer in use, so
// the next attempt waits for it.
func NewConnector(o Options) bridge.Connector {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c := &connector{o: o, making: make(chan struct{}, 1), warned: map[string]bool{}}
	c.host, _ = os.Hostname()
	return c.connect
}

type connector struct {
	o      Options
	making chan struct{} // held while a producer is being made
	host   string        // written into position records

	mu     sync.Mutex
	warned map[string]bool // warnings logged already
}

// connect makes a client and checks the topics' settings (checkTopics):
// a setting that breaks exactly-once delivery is an error (ErrTopicConfig).
func (c *connector) connect(ctx context.Context) (bridge.Producer, error) {
	type result struct {
		c        sarama.Client
		warnings []string
		err      error
	}
	ch := make(chan result, 1)
	go func() {
		client, err := sarama.NewClient(c.o.Brokers, SaramaConfig(c.o))
		if err != nil {
			ch <- result{err: explainError(err, c.o)}
			return
		}
		warnings, err := checkTopics(client, c.o)
		if err != nil {
			client.Close()
			ch <- result{err: err}
			return
		}
		ch <- result{c: client, warnings: warnings}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		c.warn(r.warnings)
		return &saramaProducer{client: r.c, o: c.o, conn: c, warnings: r.warnings, hbytes: map[string][]byte{}}, nil
	case <-ctx.Done():
		go func() { // do not leak a client made after we gave up
			if r := <-ch; r.err == nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// warn logs each warning the first time it is found.
func (c *connector) warn(warnings []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range warnings {
		if !c.warned[w] {
			c.warned[w] = true
			c.o.Logger.Warn(w)
		}
	}
}

// saramaProducer is one connection to Kafka: client reads the position
// and the topics' settings; p, made by TakeOver with a client of its own
// whose connections are metered, produces.
type saramaProducer struct {
	client   sarama.Client
	o        Options
	conn     *connector
	warnings []string        // of checkTopics
	reader   *positionReader // made by the first Committed; goes on from where it stopped

	p      sarama.AsyncProducer
	moved  *atomic.Int64     // bytes moved on the producer's connections
	hbytes map[string][]byte // header strings as bytes, made once (sarama only reads them)
}

// Warnings are the warnings of the topics' settings found at connect
// (checkTopics).
func (s *saramaProducer) Warnings() []string { return s.warnings }

// Committed reads the newest committed position record for this gateway
// from the offsets topic (see positionReader), without taking over: the
// producer of another gateway with the same id goes on undisturbed. A
// later call reads on from where the last one stopped: after TakeOver,
// which settled this gateway's own open transaction, what it returns no
// other producer can move.
func (s *saramaProducer) Committed(ctx context.Context) (bridge.Position, bool, error) {
	if s.o.TransactionalID == "" {
		return bridge.Position{}, false, nil
	}
	if s.reader == nil {
		r, err := newPositionReader(s.client, s.o.OffsetsTopic, s.o.PositionKey)
		if err != nil {
			return bridge.Position{}, false, err
		}
		s.reader = r
	}
	return s.reader.read(ctx)
}

// TakeOver makes the async producer. A transactional one is initialised
// (InitProducerId): Kafka fences every older producer with the same
// transactional id, and completes or aborts its open transaction.
func (s *saramaProducer) TakeOver(ctx context.Context) error {
	if s.p != nil {
		return errors.New("kafka producer: taken over already")
	}
	making := s.conn.making
	select {
	case making <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	type result struct {
		p   sarama.AsyncProducer
		err error
	}
	ch := make(chan result, 1)
	cfg := SaramaConfig(s.o)
	meter := newMeteredDialer(cfg.Net.DialTimeout, cfg.Net.KeepAlive)
	cfg.Net.Proxy.Enable, cfg.Net.Proxy.Dialer = true, meter
	go func() {
		p, err := sarama.NewAsyncProducer(s.o.Brokers, cfg)
		<-making
		ch <- result{p, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return explainError(r.err, s.o)
		}
		s.p, s.moved = r.p, meter.moved
		return nil
	case <-ctx.Done():
		go func() { // do not leak a producer made after we gave up
			if r := <-ch; r.err == nil {
				r.p.Close()
			}
		}()
		return ctx.Err()
	}
}

func (s *saramaProducer) bytes(v string) []byte {
	b, ok := s.hbytes[v]
	if !ok {
		b = []byte(v)
		if len(s.hbytes) < 256 {
			s.hbytes[v] = b
		}
	}
	return b
}

var (
	_ bridge.Producer = (*saramaProducer)(nil)
	_ bridge.Warner   = (*saramaProducer)(nil)
)

// Send pushes the batch and waits for every record's acknowledgement. It
// feeds the input and drains results in one loop, so a batch larger than
// sarama's channel buffers cannot deadlock.
func (s *saramaProducer) Send(ctx context.Context, batch []bridge.Record, pos bridge.Position) error {
	if s.p == nil {
		return errors.New("kafka producer: Send before TakeOver")
	}
	if s.o.TransactionalID != "" {
		return s.sendTxn(ctx, batch, pos)
	}
	return s.send(ctx, batch)
}

// sendTxn writes the batch and the position record in one transaction.
// When the outcome is unknown or the transaction failed, the producer must
// be replaced (the Forwarder does so) and the position read back.
func (s *saramaProducer) sendTxn(ctx context.Context, batch []bridge.Record, pos bridge.Position) error {
	if err := s.p.BeginTxn(); err != nil {
		return s.txnError("begin transaction", err)
	}
	all := append(batch[:len(batch):len(batch)], bridge.Record{Topic: s.o.OffsetsTopic, Key: []byte(s.o.PositionKey), Value: encodePosition(s.o.PositionKey, s.conn.host, pos)})
	if err := s.send(ctx, all); err != nil {
		if s.p.TxnStatus()&sarama.ProducerTxnFlagAbortableError != 0 {
			s.abort(ctx)
		}
		return s.txnError("produce in transaction", err)
	}
	// CommitTxn takes no context and retries for a long time when the link
	// is down; bound the wait by the stall timeout (no bytes moving). An
	// abandoned commit's outcome is unknown: the Forwarder replaces the
	// producer (whose initialisation fences this one and completes or
	// aborts the transaction) and reads the position back.
	done := make(chan error, 1)
	go func() { done <- s.p.CommitTxn() }()
	stalled := s.stallWatch()
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return s.txnError("commit transaction", err)
			}
			return nil
		case <-watch.C:
			if stalled() {
				return fmt.Errorf("commit transaction: no bytes moved to or from Kafka for %v; outcome unknown", stallTimeout(s.o))
			}
		case <-ctx.Done():
			return fmt.Errorf("commit transaction: %w; outcome unknown", ctx.Err())
		}
	}
}

// abort aborts the transaction after a failed send. sarama's AbortTxn
// first waits for the records still in flight, whose outcomes it hands to
// Successes and Errors: they are drained meanwhile (send stopped reading
// them when it gave up), or the abort, and delivery with it, would wait
// for good. An abort that makes no progress for the stall timeout, or
// outlives ctx, is abandoned: the Forwarder replaces the producer, whose
// initialisation fences this one and settles its transaction.
func (s *saramaProducer) abort(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.p.AbortTxn()
	}()
	stalled := s.stallWatch()
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	for {
		select {
		case <-done:
			return
		case <-s.p.Successes():
		case <-s.p.Errors():
		case <-watch.C:
			if stalled() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// stallWatch returns a function that reports whether no byte has moved on
// the producer's connections for the stall timeout (since stallWatch was
// called, or since the last call that saw bytes move).
func (s *saramaProducer) stallWatch() func() bool {
	stall := stallTimeout(s.o)
	last, since := s.moved.Load(), time.Now()
	return func() bool {
		if n := s.moved.Load(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) > stall
	}
}

func (s *saramaProducer) txnError(what string, err error) error {
	if errors.Is(err, bridge.ErrFenced) {
		return err
	}
	if errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch) ||
		s.p.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 {
		return fmt.Errorf("%s: %w (%v)", what, bridge.ErrFenced, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *saramaProducer) send(ctx context.Context, batch []bridge.Record) error {
	msgs := make([]sarama.ProducerMessage, len(batch))
	nh := 0
	for _, r := range batch {
		nh += len(r.Headers)
	}
	headers := make([]sarama.RecordHeader, nh) // one allocation for the batch
	for i, r := range batch {
		m := &msgs[i]
		m.Metadata = i // where a refused record is in the batch
		m.Topic = r.Topic
		m.Key = sarama.ByteEncoder(r.Key)
		m.Value = sarama.ByteEncoder(r.Value)
		if len(r.Headers) > 0 {
			m.Headers, headers = headers[:len(r.Headers):len(r.Headers)], headers[len(r.Headers):]
			for j, h := range r.Headers {
				m.Headers[j] = sarama.RecordHeader{Key: s.bytes(h.Key), Value: s.bytes(h.Value)}
			}
		}
	}
	sent, done := 0, 0
	var firstErr error
	var refused *bridge.RefusedError
	// sarama does not know PRODUCER_FENCED (error 90) as such and retries
	// the batch for a long time, although its transaction manager has
	// already failed for good; watch for that.
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	stalled := s.stallWatch()
	for done < len(batch) {
		var in chan<- *sarama.ProducerMessage
		var next *sarama.ProducerMessage
		if sent < len(batch) {
			in, next = s.p.Input(), &msgs[sent]
		}
		select {
		case in <- next:
			sent++
		case <-s.p.Successes():
			done++
		case perr := <-s.p.Errors():
			done++
			if i, ok := perr.Msg.Metadata.(int); ok && refusedForGood(perr.Err) != "" {
				if refused == nil {
					refused = &bridge.RefusedError{Reason: fmt.Sprintf("kafka refused it: %s on %s (%v)", refusedForGood(perr.Err), perr.Msg.Topic, perr.Err)}
				}
				refused.Indexes = append(refused.Indexes, i)
			} else if firstErr == nil {
				firstErr = fmt.Errorf("produce to %s: %w", perr.Msg.Topic, perr.Err)
			}
		case <-watch.C:
			if s.o.TransactionalID != "" && s.p.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 {
				return fmt.Errorf("transaction manager failed: %w", bridge.ErrFenced)
			}
			if stalled() {
				return fmt.Errorf("no bytes moved to or from kafka for %v (%d of %d records done): link down?", stallTimeout(s.o), done, len(batch))
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if firstErr == nil && refused != nil {
		slices.Sort(refused.Indexes)
		return refused
	}
	return firstErr
}

// refusedForGood returns the Kafka name of err if it refuses a record in a
// way that sending it again cannot cure: the record (or its partition's
// records in the request) is too large for the broker, malformed, or
// refused by the topic's validation; "" otherwise. sarama has already
// retried those it thinks may pass (CORRUPT_MESSAGE among them).
func refusedForGood(err error) string {
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes") {
		return "over the producer's max message bytes (kafka.max_record_bytes)" // sarama's own check, before sending
	}
	var ke sarama.KError
	if !errors.As(err, &ke) {
		return ""
	}
	return map[sarama.KError]string{
		sarama.ErrMessageSizeTooLarge:    "MESSAGE_TOO_LARGE",
		sarama.ErrMessageSetSizeTooLarge: "RECORD_LIST_TOO_LARGE",
		sarama.ErrInvalidRecord:          "INVALID_RECORD",
		sarama.ErrInvalidTimestamp:       "INVALID_TIMESTAMP",
		sarama.ErrInvalidMessage:         "CORRUPT_MESSAGE",
	}[ke]
}

// Close stops the producer, waiting at most two seconds for it to flush,
// and the client.
func (s *saramaProducer) Close() error {
	defer s.client.Close()
	if s.p == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.p.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Second):
		return errors.New("close kafka producer: timed out; in-flight records will be sent again")
	}
}
