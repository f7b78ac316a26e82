package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// start runs f; done gets Run's error when it returns, by itself or
// after stop.
func start(f *bridge.Forwarder) (done <-chan error, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- f.Run(ctx) }()
	return ch, cancel
}

// stopsBy waits up to 20 s for Run to return by itself.
func stopsBy(t *testing.T, done <-chan error, stop func()) error {
	t.Helper()
	defer stop()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		stop()
		t.Fatalf("Run did not stop by itself within 20 s; then returned %v", <-done)
		return nil
	}
}

// TestSharedGatewayID: a second gateway started with the id of one that
// runs (a copied configuration; cloned cards from before the default id
// was unique) stops with an error that says so, before it takes over
// delivery: the first is not fenced and goes on delivering, and the
// second delivered nothing.
func TestSharedGatewayID(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dirA, dirB := t.TempDir(), t.TempDir()
	a := txnForwarder(t, dirA, addrs, bridge.Options{})
	stopA := run(t, a)
	a.Summary(summary("a", 0), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 1, 20*time.Second)

	b := txnForwarder(t, dirB, addrs, bridge.Options{})
	doneB, stopB := start(b)
	b.Summary(summary("b", 1), bridge.Mark{})
	err := stopsBy(t, doneB, stopB)
	var shared *bridge.SharedIDError
	if !errors.As(err, &shared) {
		t.Fatalf("second gateway: Run = %v, want a SharedIDError", err)
	}
	host, _ := os.Hostname()
	if shared.Gateway != "gw-1" || shared.Kafka.Host != host || shared.Kafka.Queue == shared.Queue || shared.Kafka.Next != 2 ||
		shared.Adopt != filepath.Join(dirB, bridge.AdoptFile) {
		t.Errorf("error says %+v", shared)
	}
	for _, want := range []string{`two gateways share gateway.id "gw-1"`, "on host " + host, "Give each gateway its own gateway.id", "create " + filepath.Join(dirB, "adopt")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	// The queue stays usable: the gateway's shutdown queues the
	// summaries of its open windows and syncs them (they are delivered
	// once it has its own id).
	b.Summary(summary("b", 3), bridge.Mark{})
	if err := b.Sync(); err != nil {
		t.Errorf("second gateway's queue after the stop: %v", err)
	}
	if st := b.Stats(); st.Queued != 2 || st.Dropped != 0 {
		t.Errorf("second gateway's queue after the stop: %d queued, %d dropped; want 2, 0", st.Queued, st.Dropped)
	}

	// The first was not fenced: it delivers on.
	a.Summary(summary("a", 2), bridge.Mark{})
	msgs := kafkatest.Consume(t, addrs, summaries, 2, 20*time.Second)
	if err := stopA(); err != nil {
		t.Errorf("first gateway: %v", err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != "[0 2]" {
		t.Errorf("summaries in Kafka: minutes %v, want the first gateway's [0 2]", got)
	}
}

// TestAdoptWipedDataDir: a gateway whose data directory was wiped on
// purpose starts with a new queue while Kafka holds the old queue's
// position under its id. It stops (SharedIDError) until the adopt file is
// created; then it delivers from its own queue, removes the file after
// its first batch, and a later start finds its own position.
func TestAdoptWipedDataDir(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	old := t.TempDir()
	f := txnForwarder(t, old, addrs, bridge.Options{})
	stop := run(t, f)
	for m := 0; m < 5; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 5, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	wiped := t.TempDir()
	f = txnForwarder(t, wiped, addrs, bridge.Options{})
	done, cancel := start(f)
	f.Summary(summary("d", 5), bridge.Mark{})
	var shared *bridge.SharedIDError
	if err := stopsBy(t, done, cancel); !errors.As(err, &shared) {
		t.Fatalf("wiped data directory: Run = %v, want a SharedIDError", err)
	}
	adopt := filepath.Join(wiped, bridge.AdoptFile)
	if err := os.WriteFile(adopt, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	f = txnForwarder(t, wiped, addrs, bridge.Options{})
	stop = run(t, f)
	f.Summary(summary("d", 6), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 7, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("adopting: %v", err)
	}
	if _, err := os.Stat(adopt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("adopt file after the first batch: %v, want it removed", err)
	}
	restartDelivers(t, txnForwarder(t, wiped, addrs, bridge.Options{}), addrs, 7)
}

// TestRestoredDataDir: the data directory is put back from a copy taken
// before the last 5 summaries were delivered. Kafka's position for the
// queue is beyond what the copy holds, so the queue's next records would
// be taken for delivered: the forwarder stops (CopyError) until adopted.
func TestRestoredDataDir(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	dir := t.TempDir()
	f := txnForwarder(t, dir, addrs, bridge.Options{})
	stop := run(t, f)
	for m := 0; m < 5; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 5, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	f = txnForwarder(t, dir, addrs, bridge.Options{})
	stop = run(t, f)
	for m := 5; m < 10; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	kafkatest.Consume(t, addrs, summaries, 10, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	f = txnForwarder(t, backup, addrs, bridge.Options{})
	done, cancel := start(f)
	f.Summary(summary("d", 10), bridge.Mark{}) // seq 6, which Kafka's position (11) would pass off as delivered
	var ce *bridge.CopyError
	if err := stopsBy(t, done, cancel); !errors.As(err, &ce) || ce.End != 6 || ce.Kafka.Next != 11 {
		t.Fatalf("restored copy: Run = %v (%+v), want a CopyError at 6 against 11", err, ce)
	}
	if err := os.WriteFile(filepath.Join(backup, bridge.AdoptFile), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	f = txnForwarder(t, backup, addrs, bridge.Options{})
	stop = run(t, f)
	msgs := kafkatest.Consume(t, addrs, summaries, 11, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("adopting: %v", err)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 11)) {
		t.Errorf("read_committed consumer sees %v", got)
	}
}
