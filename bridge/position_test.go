package bridge_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// deliverAndLosePosition runs a forwarder on dir that delivers minutes
// [from, to) of device d, stops it, and removes its local position, as a
// power cut between Kafka's commit and the local write would: the next
// start must learn from Kafka what was delivered.
func deliverAndLosePosition(t *testing.T, f *bridge.Forwarder, dir string, addrs []string, from, to int) {
	t.Helper()
	stop := run(t, f)
	for m := from; m < to; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, to, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "meta")); err != nil {
		t.Fatalf("remove local position: %v", err)
	}
}

// restartDelivers starts a forwarder on the queue whose local position was
// lost, queues minute n and checks that a read_committed consumer sees
// minutes 0..n, each once: nothing Kafka already had was sent again.
func restartDelivers(t *testing.T, f *bridge.Forwarder, addrs []string, n int) {
	t.Helper()
	stop := run(t, f)
	f.Summary(summary("d", n), bridge.Mark{})
	msgs := kafkatest.Consume(t, addrs, summaries, n+1, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, n+1)) {
		t.Errorf("read_committed consumer sees %v, want minutes 0 to %d once each", got, n)
	}
}

// TestPositionBehindAnotherOpenTransaction: another gateway's producer
// holds a transaction open on the offsets partition (it lost power
// mid-batch, say; Kafka aborts it only after its timeout) while this
// gateway commits 20 more batches and then restarts without its local
// position. Its committed position lies beyond the partition's last
// stable offset, yet the restarted forwarder finds it and sends nothing
// again.
func TestPositionBehindAnotherOpenTransaction(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dir := t.TempDir()
	f := txnForwarder(t, dir, addrs, bridge.Options{})
	stop := run(t, f)
	for m := 0; m < 20; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 20, 20*time.Second)
	kafkatest.OpenTxn(t, addrs, offsetsTopic, "gw-other", `{"gateway":"gw-other","queue":"0123","position":7}`)
	for m := 20; m < 40; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 40, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "meta")); err != nil {
		t.Fatalf("remove local position: %v", err)
	}
	restartDelivers(t, txnForwarder(t, dir, addrs, bridge.Options{}), addrs, 40)
}

// slowFetches makes kfake answer every fetch of topic only after delay.
func slowFetches(c *kfake.Cluster, topic string, delay time.Duration) {
	c.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.FetchRequest).Topics {
			if rt.Topic == topic {
				c.SleepControl(func() { time.Sleep(delay) })
				break
			}
		}
		return nil, nil, false // kfake answers, and the control stays
	})
}

// TestPositionOverASlowLink: each fetch of the offsets topic takes 400 ms
// to come back (a slow uplink, a busy broker), and Kafka holds a position
// record per batch. The position read at the restart waits for them and
// finds the newest, rather than taking a quiet moment for the end.
func TestPositionOverASlowLink(t *testing.T) {
	c, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dir := t.TempDir()
	// One record per batch: 30 position records on the offsets topic.
	deliverAndLosePosition(t, txnForwarder(t, dir, addrs, bridge.Options{BatchSize: 1}), dir, addrs, 0, 30)
	slowFetches(c, offsetsTopic, 400*time.Millisecond)
	restartDelivers(t, txnForwarder(t, dir, addrs, bridge.Options{}), addrs, 30)
}

// TestPositionReadTimesOut: the first fetch of the offsets topic after the
// restart never comes back. The read gives up after the stall timeout and
// fails, the forwarder connects again, and the second read finds the
// position: a read that did not finish never counts as "Kafka has
// nothing".
func TestPositionReadTimesOut(t *testing.T) {
	c, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dir := t.TempDir()
	deliverAndLosePosition(t, txnForwarder(t, dir, addrs, bridge.Options{}), dir, addrs, 0, 25)
	release := make(chan struct{})
	defer close(release)
	held := false
	c.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.FetchRequest).Topics {
			if rt.Topic == offsetsTopic && !held {
				held = true
				c.DropControl()
				c.SleepControl(func() { <-release })
				return nil, nil, false
			}
		}
		return nil, nil, false
	})
	f, err := bridge.NewForwarder(bridge.Options{Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead, Dir: dir,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		kafka.NewConnector(kafka.Options{Brokers: addrs, ClientID: "test", StallTimeout: 3 * time.Second, // well over a loaded machine's answers
			TransactionalID: "edgegate-gw-1", OffsetsTopic: offsetsTopic, PositionKey: "gw-1"}))
	if err != nil {
		t.Fatal(err)
	}
	restartDelivers(t, f, addrs, 25)
	if st := f.Stats(); st.PositionErrors != 1 {
		t.Errorf("%d position errors counted, want 1", st.PositionErrors)
	}
}
