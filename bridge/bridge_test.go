package bridge_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	wire "github.com/edgegate/edgegate/bridge/summary"
)

const (
	summaries = "edge.summaries"
	dead      = "edge.deadletter"
)

// TestDeliversInOrderPerDevice sends 40 windows of 25 devices through the
// forwarder into kfake (4 partitions) and reads them back with a
// read_committed consumer: every summary exactly as sent, headers set, and
// each device's windows on one partition in order.
func TestDeliversInOrderPerDevice(t *testing.T) {
	_, addrs := kafkatest.Start(t, 4, summaries, dead)
	f := newForwarder(t, bridge.Options{Dir: t.TempDir(), BatchSize: 64}, addrs)
	stop := run(t, f)
	const devices, minutes = 25, 40
	sent := map[string]aggregate.Summary{}
	for m := 0; m < minutes; m++ {
		for d := 0; d < devices; d++ {
			s := summary(fmt.Sprintf("dev-%02d", d), m)
			sent[s.ID] = s
			f.Summary(s, bridge.Mark{})
		}
	}
	f.DeadLetter(wire.DeadLetter{Reason: "invalid_json", Detail: "x", Source: "mqtt", Topic: "sensors/a", Device: "a", Payload: []byte{0xff, 'x'}, ReceivedAt: time.Unix(0, 0)}, bridge.Mark{})
	msgs := kafkatest.Consume(t, addrs, summaries, devices*minutes, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(msgs) != devices*minutes {
		t.Fatalf("read %d summaries, want %d", len(msgs), devices*minutes)
	}
	partOf := map[string]int32{}
	lastMinute := map[string]int{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatalf("value %s: %v", m.Value, err)
		}
		want, ok := sent[s.ID]
		if !ok || s != want {
			t.Fatalf("got %+v, sent %+v", s, want)
		}
		delete(sent, s.ID)
		if string(m.Key) != "gw-1/"+s.Device {
			t.Errorf("key %q", m.Key)
		}
		if p, ok := partOf[s.Device]; ok && p != m.Partition {
			t.Errorf("device %s on partitions %d and %d", s.Device, p, m.Partition)
		}
		partOf[s.Device] = m.Partition
		if last, ok := lastMinute[s.Device]; ok && s.WindowStart.Minute() != last+1 {
			t.Errorf("device %s: window %d after %d", s.Device, s.WindowStart.Minute(), last)
		}
		lastMinute[s.Device] = s.WindowStart.Minute()
		h := map[string]string{}
		for _, rh := range m.Headers {
			h[string(rh.Key)] = string(rh.Value)
		}
		if h["edgegate-gateway"] != "gw-1" || h["edgegate-schema-version"] != strconv.Itoa(wire.SchemaVersion) || h["content-type"] != "application/json" {
			t.Errorf("headers %v", h)
		}
	}
	dl := kafkatest.Consume(t, addrs, dead, 1, 10*time.Second)
	var got map[string]any
	if err := json.Unmarshal(dl[0].Value, &got); err != nil {
		t.Fatalf("dead letter %s: %v", dl[0].Value, err)
	}
	if got["reason"] != "invalid_json" || got["payload_base64"] != "/3g=" || got["device"] != "a" || got["gateway"] != "gw-1" {
		t.Errorf("dead letter = %s", dl[0].Value)
	}
	if st := f.Stats(); st.Delivered != devices*minutes+1 || st.Dropped != 0 || st.Queued != 0 {
		t.Errorf("stats %+v", st)
	}
}

func newForwarder(t *testing.T, o bridge.Options, brokers []string) *bridge.Forwarder {
	t.Helper()
	o.Gateway, o.SummariesTopic, o.DeadletterTopic = "gw-1", summaries, dead
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	f, err := bridge.NewForwarder(o, kafka.NewConnector(kafka.Options{Brokers: brokers, ClientID: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func minutesOf(t *testing.T, msgs []*sarama.ConsumerMessage) []int {
	t.Helper()
	var out []int
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s.WindowStart.Hour()*60+s.WindowStart.Minute()-600)
	}
	return out
}

func span(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// TestQueueWhileDownDropsOldest starts with no broker and a 64 KiB quota
// under drop_oldest: the forwarder queues, drops the oldest segments when
// full (counted exactly), and delivers the rest, in order, once the broker
// comes up.
func TestQueueWhileDownDropsOldest(t *testing.T) {
	port := kafkatest.FreePort(t)
	addr := kafkatest.Addr(port)
	f := newForwarder(t, bridge.Options{Dir: t.TempDir(), MaxBytes: 64 << 10, Policy: bridge.DropOldest}, []string{addr})
	const n = 600
	for m := 0; m < n; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	st := f.Stats()
	if st.Dropped == 0 || st.Dropped+st.Queued != n || st.QueueBytes > 64<<10 {
		t.Fatalf("while down: %+v", st)
	}
	stop := run(t, f)
	kafkatest.StartOnPort(t, port, 1, summaries, dead)
	msgs := kafkatest.Consume(t, []string{addr}, summaries, int(st.Queued), 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := minutesOf(t, msgs), span(int(st.Dropped), n); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delivered minutes %v, want %v (the newest %d)", got, want, st.Queued)
	}
}

// TestQueueSurvivesRestart queues while the broker is down, stops, starts
// a new forwarder on the same directory and checks that everything is
// delivered once; then that a third start sends nothing again.
func TestQueueSurvivesRestart(t *testing.T) {
	port := kafkatest.FreePort(t)
	addr := kafkatest.Addr(port)
	dir := t.TempDir()
	// Small segments (4 KiB, about ten records) so that delivered ones are
	// unlinked.
	const quota = 64 << 10
	f := newForwarder(t, bridge.Options{Dir: dir, MaxBytes: quota, Grace: 100 * time.Millisecond}, []string{addr})
	stop := run(t, f)
	for m := 0; m < 100; m++ {
		f.Summary(summary("d", m), bridge.Mark{Seq: uint64(m + 1), N: 1})
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := f.Stats(); st.Queued != 100 || st.Delivered != 0 {
		t.Fatalf("after first run: %+v", st)
	}
	kafkatest.StartOnPort(t, port, 1, summaries, dead)
	f2 := newForwarder(t, bridge.Options{Dir: dir, MaxBytes: quota}, []string{addr})
	if st := f2.Stats(); st.Queued != 100 {
		t.Fatalf("reopened queue holds %d, want 100", st.Queued)
	}
	if m := f2.Stored(); m != (bridge.Mark{Seq: 100, N: 1}) {
		t.Errorf("reopened queue: last stored mark %+v, want {100 1}", m)
	}
	stop2 := run(t, f2)
	msgs := kafkatest.Consume(t, []string{addr}, summaries, 100, 20*time.Second)
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 100)) {
		t.Errorf("delivered %v", got)
	}
	f3 := newForwarder(t, bridge.Options{Dir: dir, MaxBytes: quota}, []string{addr})
	// Everything was delivered and the older segments unlinked; the last
	// record's mark is still known.
	if m := f3.Stored(); m != (bridge.Mark{Seq: 100, N: 1}) {
		t.Errorf("after delivery: last stored mark %+v, want {100 1}", m)
	}
	if st := f3.Stats(); st.Queued != 0 || st.QueueBytes > 8<<10 {
		t.Errorf("after delivery the queue holds %d records in %d bytes; delivered segments should be gone", st.Queued, st.QueueBytes)
	}
	stop3 := run(t, f3)
	f3.Summary(summary("d", 100), bridge.Mark{})
	msgs = kafkatest.Consume(t, []string{addr}, summaries, 101, 20*time.Second)
	if err := stop3(); err != nil {
		t.Fatal(err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 101)) {
		t.Errorf("after third start the topic holds %v: something was sent twice or lost", got)
	}
}

// TestBackpressureMark checks that Full reports the mark under the
// backpressure policy (summaries at 90% of the quota less the dead
// letters' 10%), and never under drop_oldest.
func TestBackpressureMark(t *testing.T) {
	for _, policy := range []bridge.FullPolicy{bridge.Backpressure, bridge.DropOldest} {
		f := newForwarder(t, bridge.Options{Dir: t.TempDir(), MaxBytes: 64 << 10, Policy: policy}, []string{"127.0.0.1:9"})
		m := 0
		for ; !f.Full() && m < 1000; m++ {
			f.Summary(summary("d", m), bridge.Mark{})
		}
		st := f.Stats()
		switch policy {
		case bridge.Backpressure:
			if mark := int64(64<<10-64<<10/10) / 10 * 9; !st.Full || st.QueueBytes < mark || st.QueueBytes > mark+1<<10 || st.Dropped != 0 {
				t.Errorf("backpressure: full after %d records: %+v", m, st)
			}
		case bridge.DropOldest:
			if f.Full() || st.Full || st.Dropped == 0 {
				t.Errorf("drop_oldest: %+v", st)
			}
		}
	}
}

const offsetsTopic = "edge.offsets"

func txnForwarder(t *testing.T, dir string, brokers []string, o bridge.Options) *bridge.Forwarder {
	t.Helper()
	o.Gateway, o.SummariesTopic, o.DeadletterTopic, o.Dir = "gw-1", summaries, dead, dir
	if testing.Verbose() && o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	f, err := bridge.NewForwarder(o, kafka.NewConnector(kafka.Options{Brokers: brokers, ClientID: "test",
		TransactionalID: "edgegate-gw-1", OffsetsTopic: offsetsTopic, PositionKey: "gw-1"}))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestExactlyOnceKafkaIsTheTruth delivers 50 summaries in transactions,
// then throws away the gateway's local record of what was delivered (as a
// crash between the Kafka commit and the local write would): on restart the
// forwarder reads its position back from Kafka and sends nothing twice.
func TestExactlyOnceKafkaIsTheTruth(t *testing.T) {
	_, addrs := kafkatest.Start(t, 2, summaries, dead, offsetsTopic)
	dir := t.TempDir()
	f := txnForwarder(t, dir, addrs, bridge.Options{})
	stop := run(t, f)
	for m := 0; m < 50; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 50, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "meta")); err != nil {
		t.Fatalf("remove local position: %v", err)
	}
	f2 := txnForwarder(t, dir, addrs, bridge.Options{})
	if st := f2.Stats(); st.Queued == 0 {
		t.Fatalf("without its local position the queue should look undelivered: %+v", st)
	}
	stop2 := run(t, f2)
	f2.Summary(summary("d", 50), bridge.Mark{})
	msgs := kafkatest.Consume(t, addrs, summaries, 51, 20*time.Second)
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 51)) {
		t.Errorf("read_committed consumer sees %v", got)
	}
}

// TestFencing starts a second forwarder with the same transactional id on
// a copy of the first's queue while the first runs (a card cloned from a
// running gateway: the same queue identity, so the position Kafka holds
// looks like its own): the first stops with ErrFenced and the second
// delivers.
func TestFencing(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dir1 := t.TempDir()
	f1 := txnForwarder(t, dir1, addrs, bridge.Options{})
	stop1 := run(t, f1)
	f1.Summary(summary("a", 0), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 1, 20*time.Second)
	if err := f1.Sync(); err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	if err := os.CopyFS(dir2, os.DirFS(dir1)); err != nil {
		t.Fatal(err)
	}

	f2 := txnForwarder(t, dir2, addrs, bridge.Options{})
	stop2 := run(t, f2)
	f2.Summary(summary("b", 1), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 2, 20*time.Second)

	f1.Summary(summary("a", 2), bridge.Mark{}) // the zombie tries again
	deadline := time.Now().Add(20 * time.Second)
	for f1.Stats().SendErrors == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	err := stop1()
	if !errors.Is(err, bridge.ErrFenced) {
		t.Errorf("first forwarder: %v, want ErrFenced", err)
	}
	if err := stop2(); err != nil {
		t.Errorf("second forwarder: %v", err)
	}
	msgs := kafkatest.Consume(t, addrs, summaries, 2, 20*time.Second)
	if got := minutesOf(t, msgs); fmt.Sprint(got) != "[0 1]" {
		t.Errorf("committed summaries %v; the fenced gateway's must not appear", got)
	}
}

// TestOutageExactlyOnce cuts the link to Kafka several times while
// summaries keep coming (some cuts land mid-transaction, one right after a
// commit reached the broker, before its answer came back), then checks that
// a read_committed consumer sees every summary exactly once and each
// device's in window order, and that delivery resumed within 5 s of each
// restore.
func TestOutageExactlyOnce(t *testing.T) {
	if raceDetector {
		// sarama's transaction manager reads its state under one lock and
		// writes it under another (IBM/sarama#2913); link cuts make the
		// race detector see it. make test runs this test again without
		// -race.
		t.Skip("sarama#2913: known data race in sarama's transaction manager under link cuts")
	}
	link, cluster, addrs := kafkatest.StartWithLink(t, 3, summaries, dead, offsetsTopic)
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{MaxBackoff: time.Second, BatchSize: 20})
	stop := run(t, f)
	// Summaries keep coming, one every 4 ms, round-robin over 10 devices,
	// until the cuts are over.
	const devices = 10
	stopProducing := make(chan struct{})
	produced := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stopProducing:
				produced <- n
				return
			case <-time.After(4 * time.Millisecond):
			}
			f.Summary(summary(fmt.Sprintf("dev-%d", n%devices), n/devices), bridge.Mark{})
			n++
		}
	}()
	var worst time.Duration
	for _, outage := range []time.Duration{700 * time.Millisecond, 300 * time.Millisecond, 4 * time.Second, 1500 * time.Millisecond} {
		time.Sleep(400 * time.Millisecond)
		link.Cut()
		time.Sleep(outage)
		before := f.Stats().Delivered
		restored := time.Now()
		link.Restore()
		for f.Stats().Delivered == before && time.Since(restored) < 10*time.Second {
			time.Sleep(5 * time.Millisecond)
		}
		worst = max(worst, time.Since(restored))
	}
	// A cut right after a commit reached the broker: the transaction is
	// committed but the forwarder never hears so. It must find out from
	// the position in Kafka, not send the batch again.
	link.CutAfterCommit(cluster)
	for waited := time.Now(); !link.Down(); time.Sleep(time.Millisecond) {
		if time.Since(waited) > 30*time.Second {
			t.Fatal("no transaction committed within 30 s")
		}
	}
	time.Sleep(300 * time.Millisecond)
	committedBlind := f.Stats().Delivered
	restored := time.Now()
	link.Restore()
	for f.Stats().Delivered == committedBlind && time.Since(restored) < 10*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(restored); d > 5*time.Second {
		t.Errorf("after a cut right after a commit, delivery resumed %v after the restore", d)
	}
	close(stopProducing)
	total := <-produced
	deadline := time.Now().Add(30 * time.Second)
	for f.Stats().Queued > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("slowest resumption after a restore: %v; stats %+v", worst, f.Stats())
	if worst > 5*time.Second {
		t.Errorf("delivery resumed %v after the link came back, want < 5s", worst)
	}
	msgs := kafkatest.Consume(t, addrs, summaries, total, 20*time.Second)
	seen := map[string]bool{}
	last := map[string]time.Time{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatal(err)
		}
		if seen[s.ID] {
			t.Errorf("%s window %v delivered twice", s.Device, s.WindowStart)
		}
		seen[s.ID] = true
		if prev, ok := last[s.Device]; ok && !s.WindowStart.After(prev) {
			t.Errorf("%s: window %v after %v", s.Device, s.WindowStart, prev)
		}
		last[s.Device] = s.WindowStart
	}
	if len(seen) != total || len(msgs) != total {
		t.Errorf("%d records, %d distinct, want %d", len(msgs), len(seen), total)
	}
}

// TestOldestAge: with Kafka unreachable, the age of the oldest undelivered
// record grows with the wall clock; an empty queue has none.
func TestOldestAge(t *testing.T) {
	opened := time.Now()
	f := newForwarder(t, bridge.Options{Dir: t.TempDir(), Grace: time.Millisecond}, []string{kafkatest.Addr(kafkatest.FreePort(t))})
	if age := f.Stats().OldestAge; age != 0 {
		t.Errorf("empty queue: oldest age %v", age)
	}
	f.Summary(summary("d", 0), bridge.Mark{})
	time.Sleep(1100 * time.Millisecond)
	f.Summary(summary("d", 1), bridge.Mark{})
	// At least the 1.1 s slept, at most the time since the forwarder was
	// opened (about as much, unless a loaded machine was slow meanwhile).
	if st, most := f.Stats(), time.Since(opened); st.Queued != 2 || st.OldestAge < time.Second || st.OldestAge > most {
		t.Errorf("queued %d, oldest age %v; want 2 and about 1s (%v at most)", st.Queued, st.OldestAge, most.Round(time.Millisecond))
	}
	stop := run(t, f)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

var (
	run     = kafkatest.Run
	summary = kafkatest.Summary
)
