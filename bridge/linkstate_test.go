package bridge_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// waitLink waits until the forwarder's link is in state want, and returns
// its stats then.
func waitLink(t *testing.T, f *bridge.Forwarder, want bridge.LinkState, within time.Duration) bridge.Stats {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st := f.Stats()
		if st.Link == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("link %q (error %q) after %v; want %q", st.Link, st.LinkError, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLinkStates: the link's state means what it says. Before anything
// needs sending, the probe at start finds Kafka usable: idle (the old
// forwarder said "down" until the first window closed). Cut, the next
// probe says down, with the error and the time the spell began, and
// records queued meanwhile keep that spell; restored, the records go and
// the link is up.
func TestLinkStates(t *testing.T) {
	link, _, addrs := kafkatest.StartWithLink(t, 1, summaries, dead, offsetsTopic)
	began := time.Now()
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{ProbeInterval: 100 * time.Millisecond})
	if st := f.Stats(); st.Link != bridge.LinkConnecting || st.LinkSince.Before(began) {
		t.Fatalf("a new forwarder: link %q since %v; want connecting since its start", st.Link, st.LinkSince)
	}
	stop := run(t, f)
	defer stop()
	st := waitLink(t, f, bridge.LinkIdle, 10*time.Second)
	if st.LinkUp || st.LinkError != "" || st.Connects != 0 || st.LinkChecked.IsZero() {
		t.Fatalf("idle: %+v", st)
	}

	link.Cut()
	cut := time.Now()
	st = waitLink(t, f, bridge.LinkDown, 10*time.Second)
	if st.LinkUp || !strings.HasPrefix(st.LinkError, "probe: ") || st.LinkSince.Before(cut) {
		t.Fatalf("down: %+v", st)
	}
	since := st.LinkSince
	f.Summary(summary("d", 0), bridge.Mark{})
	time.Sleep(500 * time.Millisecond) // connections fail, probes fail
	if st := f.Stats(); st.Link != bridge.LinkDown || !st.LinkSince.Equal(since) || st.Queued != 1 {
		t.Fatalf("still down: link %q since %v, %d queued; want down since %v (the spell's first failure), 1 queued", st.Link, st.LinkSince, st.Queued, since)
	}
	link.Restore()
	st = waitLink(t, f, bridge.LinkUp, 20*time.Second)
	if st.LinkError != "" || !st.LinkSince.After(since) || st.Connects != 1 {
		t.Fatalf("up: %+v", st)
	}
	kafkatest.Consume(t, addrs, summaries, 1, 10*time.Second)
}

// TestLinkDownAtStart: with no broker and nothing to send, the probe at
// start says down, with the error, within seconds (the old forwarder
// said nothing until the first window closed).
func TestLinkDownAtStart(t *testing.T) {
	addr := kafkatest.Addr(kafkatest.FreePort(t))
	f := newForwarder(t, bridge.Options{Dir: t.TempDir()}, []string{addr})
	stop := run(t, f)
	defer stop()
	st := waitLink(t, f, bridge.LinkDown, 15*time.Second)
	if !strings.HasPrefix(st.LinkError, "probe: ") || !strings.Contains(st.LinkError, addr) || st.Probe == "" {
		t.Errorf("down at start: error %q, probe %q", st.LinkError, st.Probe)
	}
	if st.Queued != 0 || st.Connects != 0 {
		t.Errorf("down at start: %+v", st)
	}
}

// TestProbeEveryInterval: while nothing needs sending, the probe runs
// again every ProbeInterval, so an idle link that breaks shows down, and
// one that is mended shows idle, without a record to send.
func TestProbeEveryInterval(t *testing.T) {
	var fail atomic.Bool
	var probes atomic.Int32
	probe := func(ctx context.Context) (string, error) {
		probes.Add(1)
		if fail.Load() {
			return "", errors.New("broker said no")
		}
		return "kafka fine", nil
	}
	addr := kafkatest.Addr(kafkatest.FreePort(t)) // never dialled: the probe is the test's
	f := newForwarder(t, bridge.Options{Dir: t.TempDir(), Probe: probe, ProbeInterval: 50 * time.Millisecond}, []string{addr})
	stop := run(t, f)
	defer stop()
	st := waitLink(t, f, bridge.LinkIdle, 5*time.Second)
	if st.Probe != "kafka fine" {
		t.Errorf("probe line %q", st.Probe)
	}
	fail.Store(true)
	st = waitLink(t, f, bridge.LinkDown, 5*time.Second)
	if st.LinkError != "probe: broker said no" {
		t.Errorf("link error %q", st.LinkError)
	}
	fail.Store(false)
	waitLink(t, f, bridge.LinkIdle, 5*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	n := probes.Load()
	time.Sleep(200 * time.Millisecond)
	if probes.Load() != n {
		t.Errorf("probes went on after Run returned: %d then %d", n, probes.Load())
	}
}

// TestOldestAgeAfterQuiet: the age of the oldest undelivered record is
// its own, not the age of the last record delivered before a quiet spell
// (the old forwarder took the first note of enqueue times at or below the
// delivered position, which after a quiet spell was the spell's start).
func TestOldestAgeAfterQuiet(t *testing.T) {
	link, _, addrs := kafkatest.StartWithLink(t, 1, summaries, dead, offsetsTopic)
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{})
	stop := run(t, f)
	defer stop()
	f.Summary(summary("d", 0), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 1, 10*time.Second)
	for f.Stats().Queued != 0 {
		time.Sleep(10 * time.Millisecond)
	}
	link.Cut()
	time.Sleep(2200 * time.Millisecond) // quiet
	f.Summary(summary("d", 1), bridge.Mark{})
	if st := f.Stats(); st.Queued != 1 || st.OldestAge >= time.Second {
		t.Fatalf("a record queued just now after 2.2 s of quiet: %d queued, oldest %v; want 1 queued, under a second old", st.Queued, st.OldestAge)
	}
	link.Restore()
}

// failingProducer connects, and fails every send after a moment, as a
// partition without enough in-sync replicas does.
type failingProducer struct{}

func (failingProducer) Committed(context.Context) (bridge.Position, bool, error) {
	return bridge.Position{}, false, nil
}
func (failingProducer) TakeOver(context.Context) error { return nil }
func (failingProducer) Send(ctx context.Context, _ []bridge.Record, _ bridge.Position) error {
	time.Sleep(20 * time.Millisecond)
	return errors.New("NOT_ENOUGH_REPLICAS")
}
func (failingProducer) Close() error { return nil }

// TestLinkNotUpWhenSendsFail: a producer that connects but never delivers
// leaves the link down, in one spell, however often it connects again
// (the old forwarder said up at each connection, and down since a moment
// ago after each failed send).
func TestLinkNotUpWhenSendsFail(t *testing.T) {
	connect := func(context.Context) (bridge.Producer, error) { return failingProducer{}, nil }
	f, err := bridge.NewForwarder(bridge.Options{Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead, Dir: t.TempDir(),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, connect)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, f)
	defer stop()
	f.Summary(summary("d", 0), bridge.Mark{})
	st := waitLink(t, f, bridge.LinkDown, 10*time.Second)
	since := st.LinkSince
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		st := f.Stats()
		if st.Link != bridge.LinkDown || !st.LinkSince.Equal(since) {
			t.Fatalf("sends that all fail: link %q since %v (%q); want down since %v throughout", st.Link, st.LinkSince, st.LinkError, since)
		}
	}
	if st := f.Stats(); st.Connects < 3 || st.Delivered != 0 || !strings.Contains(st.LinkError, "NOT_ENOUGH_REPLICAS") {
		t.Errorf("%d connects, %d delivered, error %q; want several connects, none delivered, the send's error", st.Connects, st.Delivered, st.LinkError)
	}
}

// TestLinkDownWhenQuietLinkBreaks: a link that breaks after the last
// delivery, on a gateway with nothing more to send, shows down (the old
// forwarder never probed an up link: it said up for good).
func TestLinkDownWhenQuietLinkBreaks(t *testing.T) {
	link, _, addrs := kafkatest.StartWithLink(t, 1, summaries, dead, offsetsTopic)
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{ProbeInterval: 100 * time.Millisecond})
	stop := run(t, f)
	defer stop()
	f.Summary(summary("d", 0), bridge.Mark{})
	waitLink(t, f, bridge.LinkUp, 10*time.Second)
	kafkatest.Consume(t, addrs, summaries, 1, 10*time.Second)
	link.Cut()
	cut := time.Now()
	st := waitLink(t, f, bridge.LinkDown, 15*time.Second)
	if !strings.HasPrefix(st.LinkError, "probe: ") || st.LinkSince.Before(cut) || st.Queued != 0 {
		t.Errorf("down: %+v", st)
	}
	link.Restore()
	waitLink(t, f, bridge.LinkIdle, 15*time.Second)
}
