//go:build e2e

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/bridge/summary"
)

// sinkProc is one `edgecat sink postgres` process.
type sinkProc struct {
	cmd *exec.Cmd
	out *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startSink(t *testing.T, bin, name string, args ...string) *sinkProc {
	t.Helper()
	p := &sinkProc{out: &syncBuffer{}}
	p.cmd = exec.Command(bin, append([]string{"sink", "postgres"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// buildEdgecat builds the command as it ships.
func buildEdgecat(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "edgecat")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// dataset makes devices × windows summaries (revision 0), plus revisions
// 1 of every 5th window and 2 of every 10th, the latter followed by a
// stale copy of revision 1; it returns them in production order and the
// highest revision of each window.
func dataset(devices, windows int) ([]aggregate.Summary, map[summary.Key]aggregate.Summary) {
	var out []aggregate.Summary
	want := map[summary.Key]aggregate.Summary{}
	for d := range devices {
		dev := fmt.Sprintf("dev-%04d", d)
		for w := range windows {
			out = append(out, sum(dev, w, 0))
		}
		for w := 0; w < windows; w += 5 {
			out = append(out, sum(dev, w, 1))
			if w%10 == 0 {
				out = append(out, sum(dev, w, 2), sum(dev, w, 1))
			}
		}
	}
	for _, s := range out {
		if cur, ok := want[summary.KeyOf(s)]; !ok || s.Revision > cur.Revision {
			want[summary.KeyOf(s)] = s
		}
	}
	return out, want
}

func endOffsets(t *testing.T, brokers []string, parts int32) map[int32]int64 {
	t.Helper()
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ends := map[int32]int64{}
	for p := range parts {
		if ends[p], err = client.GetOffset("edge.summaries", p, sarama.OffsetNewest); err != nil {
			t.Fatal(err)
		}
	}
	return ends
}

// storedOffsets reads the sink's offsets for the group.
func storedOffsets(t *testing.T, db *pgx.Conn, table, group string) map[int32]int64 {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`SELECT partition, coalesce(next_offset, -1) FROM %s_offsets WHERE consumer_group = $1`, table), group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var o int64
		rows.Scan(&p, &o)
		out[p] = o
	}
	return out
}

func waitCaughtUp(t *testing.T, db *pgx.Conn, table, group string, ends map[int32]int64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := storedOffsets(t, db, table, group)
		done := len(got) == len(ends)
		for p, e := range ends {
			done = done && got[p] == e
		}
		if done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("stored offsets %v, end offsets %v after %v", got, ends, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compareTable requires the table to hold exactly the highest revision of
// every window.
func compareTable(t *testing.T, db *pgx.Conn, table string, want map[summary.Key]aggregate.Summary) {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`SELECT gateway, device, metric, window_start, window_end, unit, count, min, max,
		sum, mean, first, last, stddev, revision, late, id FROM %s`, table))
	if err != nil {
		t.Fatal(err)
	}
	n, bad := 0, 0
	for rows.Next() {
		var s aggregate.Summary
		if err := rows.Scan(&s.Gateway, &s.Device, &s.Metric, &s.WindowStart, &s.WindowEnd, &s.Unit, &s.Count, &s.Min, &s.Max,
			&s.Sum, &s.Mean, &s.First, &s.Last, &s.Stddev, &s.Revision, &s.Late, &s.ID); err != nil {
			t.Fatal(err)
		}
		n++
		s.WindowStart, s.WindowEnd = s.WindowStart.UTC(), s.WindowEnd.UTC()
		if w, ok := want[summary.KeyOf(s)]; !ok || w != s {
			if bad++; bad <= 5 {
				t.Errorf("row %+v\nwant %+v", s, w)
			}
		}
	}
	if n != len(want) || bad > 0 {
		t.Errorf("table has %d rows (%d wrong), want %d", n, bad, len(want))
	}
}

// TestSinkExactlyOnce loads summaries with revisions (and stale copies)
// into 6 partitions, half before and half while three sink processes run
// in one group; one is SIGKILLed mid-way and restarted. The table must
// hold exactly the highest revision of every window, and the stored
// offsets must equal the end offsets.
func TestSinkExactlyOnce(t *testing.T) {
	dsn := startPostgres(t)
	bin := buildEdgecat(t)
	_, brokers := kafkatest.Start(t, 6, "edge.summaries")
	data, want := dataset(300, 40)
	produce(t, brokers, -1, data[:1000]...) // some backlog before the members join
	args := []string{"--brokers", strings.Join(brokers, ","), "--dsn", dsn, "--group", "warehouse", "--batch", "200", "--flush", "50ms",
		"--progress", "500ms", "--session-timeout", "6s"}
	sinks := []*sinkProc{startSink(t, bin, "sink-1", args...), startSink(t, bin, "sink-2", args...), startSink(t, bin, "sink-3", args...)}
	db, err := pgx.Connect(context.Background(), dsn)
	for deadline := time.Now().Add(20 * time.Second); err != nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		db, err = pgx.Connect(context.Background(), dsn)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// Wait until the three share the six partitions.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var members, parts int
		db.QueryRow(context.Background(), `SELECT count(DISTINCT member), count(*) FROM edge_summaries_offsets WHERE consumer_group = 'warehouse'`).Scan(&members, &parts)
		if members == 3 && parts == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s, %d members hold %d partitions", members, parts)
		}
	}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		// A live stream, over some seconds.
		for i := 1000; i < len(data); i += 300 {
			produceErr(brokers, data[i:min(i+300, len(data))])
			time.Sleep(60 * time.Millisecond)
		}
	}()
	defer func() { <-produced }()

	// Kill one member once about a third is in the table.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		db.QueryRow(context.Background(), "SELECT count(*) FROM edge_summaries").Scan(&n)
		if n > len(want)/3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d rows after 60 s", n)
		}
	}
	killedAt := time.Now()
	sinks[1].cmd.Process.Signal(syscall.SIGKILL)
	sinks[1].cmd.Wait()
	time.Sleep(time.Second)
	sinks[1] = startSink(t, bin, "sink-2 (restarted)", args...)

	<-produced
	ends := endOffsets(t, brokers, 6)
	if sumOf(ends) != int64(len(data)) {
		t.Fatalf("produced %d records, want %d", sumOf(ends), len(data))
	}
	took := waitCaughtUp(t, db, "edge_summaries", "warehouse", ends, 2*time.Minute)
	t.Logf("%d records, %d windows; all stored %v after the kill (caught up %v after the last record)", len(data), len(want),
		time.Since(killedAt).Round(time.Millisecond), took.Round(time.Millisecond))
	compareTable(t, db, "edge_summaries", want)
	var rejected int
	db.QueryRow(context.Background(), "SELECT count(*) FROM edge_summaries_rejected").Scan(&rejected)
	if rejected != 0 {
		t.Errorf("%d records rejected", rejected)
	}
	for i, s := range sinks {
		s.cmd.Process.Signal(syscall.SIGTERM)
		if err := s.cmd.Wait(); err != nil {
			t.Errorf("sink %d: %v\n%s", i+1, err, s.out.String())
		}
	}
	for i, s := range sinks {
		t.Logf("sink %d progress:\n%s", i+1, progressLines(s.out.String()))
		if !strings.Contains(s.out.String(), "partitions assigned") {
			t.Errorf("sink %d never held a partition", i+1)
		}
	}
}

// produceErr is produce for a goroutine: it reports failure by what the
// end offsets then say.
func produceErr(brokers []string, ss []aggregate.Summary) {
	cfg := sarama.NewConfig()
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	for _, s := range ss {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: "edge.summaries", Key: sarama.ByteEncoder(summary.RecordKey(&s)), Value: sarama.ByteEncoder(summary.AppendJSON(nil, &s))})
	}
	p.SendMessages(msgs)
}

func sumOf(m map[int32]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func progressLines(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "t=") || strings.Contains(l, "partitions assigned") || strings.Contains(l, "fenced") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestSinkThroughput measures the rows per second one member and three
// write into PostgreSQL. The group forms on an empty topic first, then
// 60,000 summaries arrive at once; the rate is rows over the time between
// the first and the last transaction that wrote them (no assertion on
// speed: the figures are logged).
func TestSinkThroughput(t *testing.T) {
	dsn := startPostgres(t)
	bin := buildEdgecat(t)
	_, brokers := kafkatest.Start(t, 6, "tp_1", "tp_3")
	var data []aggregate.Summary
	for d := range 1000 {
		for w := range 60 {
			data = append(data, sum(fmt.Sprintf("dev-%04d", d), w, 0))
		}
	}
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	var table bytes.Buffer
	fmt.Fprintf(&table, "%-8s %8s %14s %10s %22s\n", "members", "rows", "write seconds", "rows/s", "produce to caught up")
	for _, members := range []int{1, 3} {
		name := fmt.Sprintf("tp_%d", members)
		args := []string{"--brokers", strings.Join(brokers, ","), "--topic", name, "--dsn", dsn, "--group", name, "--table", name, "--progress", "0"}
		if out, err := exec.Command(bin, append([]string{"sink", "postgres", "--init"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("init: %v %s", err, out)
		}
		var ps []*sinkProc
		for i := range members {
			ps = append(ps, startSink(t, bin, fmt.Sprintf("%s-%d", name, i), args...))
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var m, parts int
			db.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(DISTINCT member), count(*) FROM %s_offsets`, name)).Scan(&m, &parts)
			if m == members && parts == 6 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the group did not form: %d members hold %d partitions", name, m, parts)
			}
		}
		start := time.Now()
		produceTo(t, brokers, name, -1, data...)
		client, err := sarama.NewClient(brokers, sarama.NewConfig())
		if err != nil {
			t.Fatal(err)
		}
		ends := map[int32]int64{}
		for p := range int32(6) {
			ends[p], _ = client.GetOffset(name, p, sarama.OffsetNewest)
		}
		client.Close()
		waitCaughtUp(t, db, name, name, ends, 3*time.Minute)
		took := time.Since(start)
		for _, p := range ps {
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.cmd.Wait()
		}
		var n int
		var span float64
		db.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*), extract(epoch FROM max(updated_at) - min(updated_at)) FROM %s`, name)).Scan(&n, &span)
		if n != len(data) {
			t.Errorf("%s: %d rows, want %d", name, n, len(data))
		}
		fmt.Fprintf(&table, "%-8d %8d %14.2f %10.0f %21.2fs\n", members, n, span, float64(n)/span, took.Seconds())
	}
	t.Logf("sink throughput:\n%s", table.String())
}

// fakeSession is the part of a consumer-group session the sink uses: a
// member id, a generation, claims, and the offsets it is told to move to.
type fakeSession struct {
	sarama.ConsumerGroupSession
	member string
	gen    int32
	claims map[string][]int32
	reset  map[int32]int64
}

func (f *fakeSession) Claims() map[string][]int32                         { return f.claims }
func (f *fakeSession) MemberID() string                                   { return f.member }
func (f *fakeSession) GenerationID() int32                                { return f.gen }
func (f *fakeSession) Context() context.Context                           { return context.Background() }
func (f *fakeSession) ResetOffset(_ string, p int32, off int64, _ string) { f.reset[p] = off }
func (f *fakeSession) MarkOffset(_ string, _ int32, _ int64, _ string)    {}

// TestSinkFencing: once a newer generation has claimed a partition, a
// member of the older one cannot write to it, and the new owner starts
// from the offset the old one stored.
func TestSinkFencing(t *testing.T) {
	dsn := startPostgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := createTables(context.Background(), pool, "fence"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := newSink(pool, log, "fence", "g", "edge.summaries", 100, time.Second)
	msg := func(off int64, x aggregate.Summary) *sarama.ConsumerMessage {
		return &sarama.ConsumerMessage{Topic: "edge.summaries", Partition: 0, Offset: off, Value: summary.AppendJSON(nil, &x)}
	}
	old := &fakeSession{member: "old", gen: 1, claims: map[string][]int32{"edge.summaries": {0}}, reset: map[int32]int64{}}
	if err := s.Setup(old); err != nil {
		t.Fatal(err)
	}
	if err := s.write(old, 0, []*sarama.ConsumerMessage{msg(0, sum("a", 0, 0)), msg(1, sum("a", 1, 0))}); err != nil {
		t.Fatal(err)
	}
	// A rebalance gives partition 0 to another member; the old one has
	// not noticed.
	cur := &fakeSession{member: "new", gen: 2, claims: map[string][]int32{"edge.summaries": {0}}, reset: map[int32]int64{}}
	if err := s.Setup(cur); err != nil {
		t.Fatal(err)
	}
	if cur.reset[0] != 2 {
		t.Errorf("new owner starts at %d, want 2 (the stored offset)", cur.reset[0])
	}
	if err := s.write(old, 0, []*sarama.ConsumerMessage{msg(2, sum("a", 0, 1))}); !errors.Is(err, errFenced) {
		t.Errorf("write by the old generation: %v, want fenced", err)
	}
	// The new owner writes; a batch read again from an older position
	// skips what is stored; a stale revision never replaces a newer one.
	if err := s.write(cur, 0, []*sarama.ConsumerMessage{msg(1, sum("a", 1, 0)), msg(2, sum("a", 0, 2)), msg(3, sum("a", 0, 1))}); err != nil {
		t.Fatal(err)
	}
	var rev, n int
	var next int64
	pool.QueryRow(context.Background(), `SELECT revision FROM fence WHERE device = 'a' AND window_start = $1`, t0).Scan(&rev)
	pool.QueryRow(context.Background(), `SELECT count(*) FROM fence`).Scan(&n)
	pool.QueryRow(context.Background(), `SELECT next_offset FROM fence_offsets`).Scan(&next)
	if rev != 2 || n != 2 || next != 4 || s.skipped.Load() != 1 {
		t.Errorf("revision %d, rows %d, next offset %d, skipped %d; want 2, 2, 4, 1", rev, n, next, s.skipped.Load())
	}
	// A record that is not a summary is kept, with its reason.
	bad := &sarama.ConsumerMessage{Topic: "edge.summaries", Partition: 0, Offset: 4, Value: []byte(`{"id":"x"}`)}
	if err := s.write(cur, 0, []*sarama.ConsumerMessage{bad}); err != nil {
		t.Fatal(err)
	}
	var reason string
	pool.QueryRow(context.Background(), `SELECT error FROM fence_rejected WHERE "offset" = 4`).Scan(&reason)
	if !strings.Contains(reason, "missing fields") {
		t.Errorf("rejected reason %q", reason)
	}
}
