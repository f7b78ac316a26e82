package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/edgegate/edgegate/bridge/summary"
)

// The sink is the classic exactly-once consumer: the summaries of a batch
// and the partition's next offset are written in one database
// transaction, and on every partition assignment the member starts from
// the offset in the database, not from Kafka's committed one (which it
// still commits, after the database, so that lag tools see progress).
//
// Fencing: when a member is assigned a partition it writes its generation
// and member id into the partition's offset row; every batch transaction
// locks that row and goes ahead only if they are still its own. A member
// that lost the partition in a rebalance it has not noticed yet (paused,
// partitioned away) therefore cannot write after the new owner began.
//
// The sink needs an eager assignor (range, the default): each rebalance
// starts a new session, whose Setup is where the offsets are read.

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,50}$`)

// schema returns the DDL for the table and its companions.
func schema(table string) string {
	return fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %[1]s (
	gateway         text             NOT NULL,
	device          text             NOT NULL,
	metric          text             NOT NULL,
	window_start    timestamptz      NOT NULL,
	window_end      timestamptz      NOT NULL,
	unit            text             NOT NULL,
	count           bigint           NOT NULL,
	min             double precision NOT NULL,
	max             double precision NOT NULL,
	sum             double precision NOT NULL,
	mean            double precision NOT NULL,
	first           double precision NOT NULL,
	last            double precision NOT NULL,
	stddev          double precision NOT NULL,
	revision        integer          NOT NULL,
	late            bigint           NOT NULL,
	id              text             NOT NULL,
	kafka_partition integer          NOT NULL,
	kafka_offset    bigint           NOT NULL,
	updated_at      timestamptz      NOT NULL DEFAULT now(),
	PRIMARY KEY (gateway, device, metric, window_start)
);
CREATE TABLE IF NOT EXISTS %[1]s_offsets (
	consumer_group text        NOT NULL,
	topic          text        NOT NULL,
	partition      integer     NOT NULL,
	next_offset    bigint,
	generation     integer     NOT NULL,
	member         text        NOT NULL,
	updated_at     timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, topic, partition)
);
CREATE TABLE IF NOT EXISTS %[1]s_rejected (
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	"offset"    bigint      NOT NULL,
	error       text        NOT NULL,
	value       bytea,
	rejected_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (topic, partition, "offset")
);`, table)
}

// createTables creates the tables if they are missing. Sinks started
// together would race: CREATE TABLE IF NOT EXISTS is not safe against a
// concurrent one, so they take turns under an advisory lock.
func createTables(ctx context.Context, pool *pgxpool.Pool, table string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "edgecat sink schema "+table); err != nil {
		return fmt.Errorf("postgres: lock for creating tables: %w", err)
	}
	if _, err := tx.Exec(ctx, schema(table)); err != nil {
		return fmt.Errorf("postgres: create tables: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: create tables: %w", err)
	}
	return nil
}

// errFenced: another member owns the partition now.
var errFenced = errors.New("partition fenced: another member owns it now")

type sink struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	table string
	group string
	topic string
	batch int
	flush time.Duration

	upsert, claim, lock, advance, reject string

	rows, batches, rejected, skipped atomic.Int64

	mu   sync.Mutex
	lag  map[int32]int64 // per partition held: end − next
	held []int32
	gen  int32
}

func newSink(pool *pgxpool.Pool, log *slog.Logger, table, group, topic string, batch int, flush time.Duration) *sink {
	return &sink{pool: pool, log: log, table: table, group: group, topic: topic, batch: batch, flush: flush, lag: map[int32]int64{},
		upsert: fmt.Sprintf(`INSERT INTO %[1]s AS t (gateway, device, metric, window_start, window_end, unit, count, min, max, sum, mean,
	first, last, stddev, revision, late, id, kafka_partition, kafka_offset)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::text[], $7::bigint[],
	$8::float8[], $9::float8[], $10::float8[], $11::float8[], $12::float8[], $13::float8[], $14::float8[], $15::int[],
	$16::bigint[], $17::text[], $18::int[], $19::bigint[])
ON CONFLICT (gateway, device, metric, window_start) DO UPDATE SET window_end = EXCLUDED.window_end, unit = EXCLUDED.unit,
	count = EXCLUDED.count, min = EXCLUDED.min, max = EXCLUDED.max, sum = EXCLUDED.sum, mean = EXCLUDED.mean,
	first = EXCLUDED.first, last = EXCLUDED.last, stddev = EXCLUDED.stddev, revision = EXCLUDED.revision,
	late = EXCLUDED.late, id = EXCLUDED.id, kafka_partition = EXCLUDED.kafka_partition,
	kafka_offset = EXCLUDED.kafka_offset, updated_at = now()
WHERE t.revision < EXCLUDED.revision`, table),
		claim: fmt.Sprintf(`INSERT INTO %s_offsets AS o (consumer_group, topic, partition, next_offset, generation, member)
VALUES ($1, $2, $3, NULL, $4, $5)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET generation = EXCLUDED.generation, member = EXCLUDED.member, updated_at = now()
RETURNING next_offset`, table),
		lock: fmt.Sprintf(`SELECT next_offset, generation, member FROM %s_offsets
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, table),
		advance: fmt.Sprintf(`UPDATE %s_offsets SET next_offset = $4, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3`, table),
		reject: fmt.Sprintf(`INSERT INTO %s_rejected (topic, partition, "offset", error, value) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`, table),
	}
}

// Setup claims the session's partitions in the database and moves the
// group's positions to the offsets stored there.
func (s *sink) Setup(sess sarama.ConsumerGroupSession) error {
	parts := slices.Sorted(slices.Values(sess.Claims()[s.topic]))
	ctx := sess.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	starts := map[int32]any{}
	for _, p := range parts {
		var next *int64
		if err := tx.QueryRow(ctx, s.claim, s.group, s.topic, p, sess.GenerationID(), sess.MemberID()).Scan(&next); err != nil {
			return fmt.Errorf("setup: claim partition %d: %w", p, err)
		}
		if next != nil {
			// Both: ResetOffset only moves back, MarkOffset only forward.
			sess.ResetOffset(s.topic, p, *next, "")
			sess.MarkOffset(s.topic, p, *next, "")
			starts[p] = *next
		} else {
			starts[p] = "kafka"
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	s.mu.Lock()
	s.held, s.gen = parts, sess.GenerationID()
	clear(s.lag)
	s.mu.Unlock()
	s.log.Info("partitions assigned", "generation", sess.GenerationID(), "partitions", parts, "start_offsets_from_database", starts)
	return nil
}

func (s *sink) Cleanup(sess sarama.ConsumerGroupSession) error {
	s.mu.Lock()
	s.held = nil
	s.mu.Unlock()
	return nil
}

// ConsumeClaim writes the partition's records in batches of up to
// s.batch, or whatever arrived within s.flush.
func (s *sink) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	var batch []*sarama.ConsumerMessage
	timer := time.NewTimer(s.flush)
	defer timer.Stop()
	write := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := s.write(sess, claim.Partition(), batch); err != nil {
			return err
		}
		next := batch[len(batch)-1].Offset + 1
		sess.MarkOffset(s.topic, claim.Partition(), next, "")
		s.mu.Lock()
		s.lag[claim.Partition()] = max(0, claim.HighWaterMarkOffset()-next)
		s.mu.Unlock()
		batch = batch[:0]
		return nil
	}
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return write()
			}
			batch = append(batch, m)
			if len(batch) >= s.batch {
				if err := write(); err != nil {
					return err
				}
				timer.Reset(s.flush)
			}
		case <-timer.C:
			if err := write(); err != nil {
				return err
			}
			timer.Reset(s.flush)
		case <-sess.Context().Done():
			return nil // revoked: the batch is not written, the next owner reads it again
		}
	}
}

// write stores one batch of a partition and its next offset in one
// transaction.
func (s *sink) write(sess sarama.ConsumerGroupSession, partition int32, msgs []*sarama.ConsumerMessage) error {
	ctx := sess.Context()
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("partition %d: begin: %w", partition, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var next *int64
	var gen int32
	var member string
	if err := tx.QueryRow(ctx, s.lock, s.group, s.topic, partition).Scan(&next, &gen, &member); err != nil {
		return fmt.Errorf("partition %d: lock offsets: %w", partition, err)
	}
	if gen != sess.GenerationID() || member != sess.MemberID() {
		return fmt.Errorf("partition %d (generation %d): %w (generation %d, member %s)", partition, sess.GenerationID(), errFenced, gen, member)
	}
	var merged summary.Merged
	offsetOf := map[summary.Key]*sarama.ConsumerMessage{}
	var rejected, skipped int
	for _, m := range msgs {
		if next != nil && m.Offset < *next {
			skipped++ // stored by an earlier transaction
			continue
		}
		r := decode(m)
		if r.Err != nil {
			rejected++
			if _, err := tx.Exec(ctx, s.reject, s.topic, partition, m.Offset, r.Err.Error(), m.Value); err != nil {
				return fmt.Errorf("partition %d offset %d: store rejected record: %w", partition, m.Offset, err)
			}
			s.log.Warn("record is not a valid summary; stored in the rejected table", "partition", partition, "offset", m.Offset, "err", r.Err)
			continue
		}
		if o := merged.Add(r.Summary); o == summary.New || o == summary.Replaced {
			offsetOf[summary.KeyOf(r.Summary)] = m
		}
	}
	all := merged.All()
	if len(all) > 0 {
		n := len(all)
		var (
			gw, dev, met, unit, id          = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			ws, we                          = make([]time.Time, n), make([]time.Time, n)
			count, late, offs               = make([]int64, n), make([]int64, n), make([]int64, n)
			mn, mx, sum, mean, fst, lst, sd = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
			rev, part                       = make([]int32, n), make([]int32, n)
		)
		for i, x := range all {
			gw[i], dev[i], met[i], unit[i], id[i] = x.Gateway, x.Device, x.Metric, x.Unit, x.ID
			ws[i], we[i] = x.WindowStart, x.WindowEnd
			count[i], late[i], offs[i] = x.Count, x.Late, offsetOf[summary.KeyOf(x)].Offset
			mn[i], mx[i], sum[i], mean[i], fst[i], lst[i], sd[i] = x.Min, x.Max, x.Sum, x.Mean, x.First, x.Last, x.Stddev
			rev[i], part[i] = int32(x.Revision), partition
		}
		if _, err := tx.Exec(ctx, s.upsert, gw, dev, met, ws, we, unit, count, mn, mx, sum, mean, fst, lst, sd, rev, late, id, part, offs); err != nil {
			return fmt.Errorf("partition %d: upsert %d summaries: %w", partition, n, err)
		}
	}
	last := msgs[len(msgs)-1].Offset + 1
	if next == nil || last > *next {
		if _, err := tx.Exec(ctx, s.advance, s.group, s.topic, partition, last); err != nil {
			return fmt.Errorf("partition %d: store offset: %w", partition, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("partition %d: commit: %w", partition, err)
	}
	s.rows.Add(int64(len(all)))
	s.batches.Add(1)
	s.rejected.Add(int64(rejected))
	s.skipped.Add(int64(skipped))
	return nil
}

func cmdSinkPostgres(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("edgecat sink postgres", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var k kafkaFlags
	k.register(fs)
	dsn := fs.String("dsn", envOr("EDGECAT_PG_DSN", ""), "PostgreSQL connection string (env EDGECAT_PG_DSN; empty: the PG* environment variables)")
	group := fs.String("group", "edgecat-sink", "Kafka consumer group: run several sinks with one group to share the partitions")
	table := fs.String("table", "edge_summaries", "table name; <table>_offsets holds the offsets, <table>_rejected records that are not summaries")
	initOnly := fs.Bool("init", false, "create the tables if missing and exit")
	batch := fs.Int("batch", 2000, "most records per transaction")
	flush := fs.Duration("flush", 200*time.Millisecond, "write what arrived at least this often")
	progress := fs.Duration("progress", 5*time.Second, "print a progress line this often (0: never)")
	sessionTimeout := fs.Duration("session-timeout", 10*time.Second, "consumer-group session timeout: how soon a dead member's partitions move")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !identRE.MatchString(*table) {
		return usageError{fmt.Errorf("--table %q: use lower-case letters, digits and _", *table)}
	}
	if *batch < 1 || *flush <= 0 {
		return usageError{errors.New("--batch must be at least 1 and --flush positive")}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("group", *group)
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	if err := createTables(ctx, pool, *table); err != nil {
		return err
	}
	if *initOnly {
		fmt.Fprintf(stdout, "tables %[1]s, %[1]s_offsets and %[1]s_rejected are ready\n", *table)
		return nil
	}
	cfg := k.config()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = true // what the database already has, for lag tools
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
	cfg.Consumer.Group.Session.Timeout = *sessionTimeout
	cfg.Consumer.Group.Heartbeat.Interval = *sessionTimeout / 5
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	cg, err := sarama.NewConsumerGroup(k.brokerList(), *group, cfg)
	if err != nil {
		return fmt.Errorf("join group %s: %w", *group, err)
	}
	s := newSink(pool, log, *table, *group, k.topic, *batch, *flush)
	var wg sync.WaitGroup
	pctx, pcancel := context.WithCancel(ctx)
	defer func() {
		// Leave the group first: that ends the errors goroutine.
		pcancel()
		if err := cg.Close(); err != nil {
			log.Warn("leave group", "err", err)
		}
		wg.Wait()
	}()
	if *progress > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.report(pctx, *progress, stdout)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for err := range cg.Errors() {
			log.Warn("consumer group", "err", err)
		}
	}()
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{k.topic}, s); err != nil && ctx.Err() == nil {
			if errors.Is(err, sarama.ErrInvalidSessionTimeout) {
				return fmt.Errorf("--session-timeout %s: the brokers refuse it (their group.min.session.timeout.ms and group.max.session.timeout.ms; Kafka's defaults allow 6s to 30m): %w", *sessionTimeout, err)
			}
			log.Warn("session ended; rejoining", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	log.Info("stopped", "rows", s.rows.Load(), "batches", s.batches.Load())
	return nil
}

// report prints a progress line every interval: rows written, their rate,
// the partitions held and the lag behind their ends.
func (s *sink) report(ctx context.Context, every time.Duration, w io.Writer) {
	t := time.NewTicker(every)
	defer t.Stop()
	start, last := time.Now(), int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows := s.rows.Load()
		s.mu.Lock()
		var lag int64
		for _, p := range s.held {
			lag += s.lag[p]
		}
		held := slices.Clone(s.held)
		gen := s.gen
		s.mu.Unlock()
		lagText := fmt.Sprint(lag)
		if len(held) == 0 {
			lagText = "- (no partitions: joining or rebalancing)"
		}
		fmt.Fprintf(w, "t=%5.1fs rows %9d (%7.0f/s) batches %7d rejected %d partitions %v (generation %d) lag %s\n",
			time.Since(start).Seconds(), rows, float64(rows-last)/every.Seconds(), s.batches.Load(), s.rejected.Load(), held, gen, lagText)
		last = rows
	}
}
