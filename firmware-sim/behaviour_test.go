package firmwaresim_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// arrival is one publication as a real mochi broker received it.
type arrival struct {
	client   string
	protocol byte
	at       time.Time
	topic    string
	payload  string
	qos      byte
}

type wire struct {
	mqtt.HookBase
	mu   sync.Mutex
	got  []arrival
	conn map[string]int // connections per client id
}

func (w *wire) ID() string { return "wire" }
func (w *wire) Provides(b byte) bool {
	return b == mqtt.OnPublish || b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck || b == mqtt.OnSessionEstablished
}
func (w *wire) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }
func (w *wire) OnACLCheck(*mqtt.Client, string, bool) bool              { return true }
func (w *wire) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	w.mu.Lock()
	w.conn[cl.ID]++
	w.mu.Unlock()
}
func (w *wire) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	w.mu.Lock()
	w.got = append(w.got, arrival{cl.ID, cl.Properties.ProtocolVersion, time.Now(), pk.TopicName, string(pk.Payload), pk.FixedHeader.Qos})
	w.mu.Unlock()
	return pk, nil
}

func (w *wire) of(client string) []arrival {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []arrival
	for _, a := range w.got {
		if a.client == client {
			out = append(out, a)
		}
	}
	return out
}

// startBroker runs a real mochi broker on a loopback port that records
// what arrives.
func startBroker(t *testing.T) (string, *wire) {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), InlineClient: false})
	w := &wire{conn: map[string]int{}}
	srv.AddHook(w, nil)
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	if err := srv.AddListener(tcp); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return tcp.Address(), w
}

// runFor runs a fleet of one device for d and returns its truth log.
func runFor(t *testing.T, addr string, dev firmwaresim.Device, d time.Duration) (*firmwaresim.Fleet, []firmwaresim.Sent) {
	t.Helper()
	f := &firmwaresim.Fleet{Addr: addr, Devices: []firmwaresim.Device{dev}, Truth: &firmwaresim.Truth{}, Seed: 7}
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	f.Run(ctx)
	return f, f.Truth.Sent()
}

// eventTime decodes the time of a v+t payload.
func eventTime(t *testing.T, payload string) time.Time {
	t.Helper()
	var v struct {
		T time.Time `json:"t"`
	}
	if err := json.Unmarshal([]byte(payload), &v); err != nil {
		t.Fatalf("payload %q: %v", payload, err)
	}
	return v.T
}

func oneMetric() []firmwaresim.Metric {
	return []firmwaresim.Metric{{Name: "x", Signal: firmwaresim.Signal{Base: 1, Noise: 1, Resolution: 0.001}}}
}

// TestOfflineReplayInOrder: a device offline for 300 ms of every 600 ms
// sends nothing meanwhile, then replays its buffer oldest first: on the
// wire, event times only increase, there are gaps as long as the outages,
// and every reading sampled arrives once.
func TestOfflineReplayInOrder(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "off", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{OfflineEvery: 600 * time.Millisecond, OfflineFor: 300 * time.Millisecond}}
	_, truth := runFor(t, addr, dev, 2*time.Second)
	got := w.of("off")
	if len(got) != len(truth) || len(got) < 40 {
		t.Fatalf("%d on the wire, %d in the truth log", len(got), len(truth))
	}
	var maxGap time.Duration
	replayed := 0
	for i := range got {
		if i > 0 {
			if !eventTime(t, got[i].payload).After(eventTime(t, got[i-1].payload)) {
				t.Fatalf("#%d out of order: %s after %s", i, got[i].payload, got[i-1].payload)
			}
			maxGap = max(maxGap, got[i].at.Sub(got[i-1].at))
		}
		if got[i].at.Sub(eventTime(t, got[i].payload)) > 200*time.Millisecond {
			replayed++ // sampled while offline, sent on return
		}
		if truth[i].Value != mustValue(t, got[i].payload) || !truth[i].Acked {
			t.Errorf("#%d: wire %s, truth %+v", i, got[i].payload, truth[i])
		}
	}
	if maxGap < 250*time.Millisecond || replayed < 10 {
		t.Errorf("longest silence %v, %d readings replayed late; want an outage of ~300ms and a replay", maxGap, replayed)
	}
}

func mustValue(t *testing.T, payload string) float64 {
	var v struct {
		V float64 `json:"v"`
	}
	if err := json.Unmarshal([]byte(payload), &v); err != nil {
		t.Fatal(err)
	}
	return v.V
}

// TestInterleavedReplay: with Interleave, readings taken during a replay
// go out ahead of the rest of the buffer: event times on the wire go back
// when the replay resumes, while the buffered ones stay in order among
// themselves.
func TestInterleavedReplay(t *testing.T) {
	addr, w := startBroker(t)
	// Slow the replay down with many metrics per sample so live samples
	// land in the middle of it.
	var ms []firmwaresim.Metric
	for range 20 {
		ms = append(ms, oneMetric()...)
	}
	for i := range ms {
		ms[i].Name = string(rune('a' + i))
	}
	dev := firmwaresim.Device{ID: "inter", Metrics: ms, Interval: 10 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{OfflineEvery: 1500 * time.Millisecond, OfflineFor: 700 * time.Millisecond, Interleave: true}}
	_, truth := runFor(t, addr, dev, 2500*time.Millisecond)
	got := w.of("inter")
	if len(got) != len(truth) {
		t.Fatalf("%d on the wire, %d in the truth log", len(got), len(truth))
	}
	backwards := 0
	var times []time.Time
	for i := range got {
		times = append(times, eventTime(t, got[i].payload))
		if i > 0 && times[i].Before(times[i-1]) {
			backwards++
		}
	}
	if backwards == 0 {
		t.Error("no live reading overtook the buffer")
	}
	// Every reading arrived exactly once.
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, func(a, b time.Time) int { return a.Compare(b) })
	if len(slices.CompactFunc(sorted, func(a, b time.Time) bool { return false })) != len(truth) {
		t.Error("lost or doubled readings")
	}
	t.Logf("%d publications, %d times the event time went back", len(got), backwards)
}

// TestClockSkewAndDrift: the event time in the payload is the device's
// clock: 90 s ahead of the wire arrival, and with drift, ahead by more as
// time goes on.
func TestClockSkewAndDrift(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "skew", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{ClockSkew: 90 * time.Second, ClockDrift: 0.5}}
	runFor(t, addr, dev, time.Second)
	got := w.of("skew")
	if len(got) < 20 {
		t.Fatalf("only %d publications", len(got))
	}
	first, last := got[0], got[len(got)-1]
	ahead := func(a arrival) time.Duration { return eventTime(t, a.payload).Sub(a.at) }
	if d := ahead(first); d < 89*time.Second || d > 91*time.Second {
		t.Errorf("first reading %v ahead of arrival, want ~90s", d)
	}
	// Drift 0.5 s/s: over the run the device clock gains half the elapsed time.
	gain := ahead(last) - ahead(first)
	if el := last.at.Sub(first.at); gain < el/2-50*time.Millisecond || gain > el/2+50*time.Millisecond {
		t.Errorf("gained %v over %v, want half", gain, el)
	}
}

// TestClockUnsetThenSet: a device whose clock was never set stamps its
// readings from 1970, counting from its start, until its clock is set
// (ClockStepAt); then with true time. One 3 days stale is behind by that
// until it is set. The bounds hold however slowly the machine runs: a
// reading is sampled after the test began and before it arrived.
func TestClockUnsetThenSet(t *testing.T) {
	const stepAt = 500 * time.Millisecond
	for name, b := range map[string]firmwaresim.Behaviour{
		"unset": {ClockUnset: true, ClockStepAt: stepAt},
		"stale": {ClockOffset: -72 * time.Hour, ClockStepAt: stepAt},
	} {
		t.Run(name, func(t *testing.T) {
			addr, w := startBroker(t)
			dev := firmwaresim.Device{ID: name, Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT, Behaviour: b}
			began := time.Now()
			runFor(t, addr, dev, 1500*time.Millisecond)
			before, after := 0, 0
			for _, a := range w.of(name) {
				at := eventTime(t, a.payload)
				switch {
				case !at.Before(began.Add(stepAt)) && !at.After(a.at): // set: true time, sampled before it arrived
					after++
				case name == "unset" && !at.Before(time.Unix(0, 0)) && at.Before(time.Unix(0, 0).Add(stepAt)):
					before++
				case name == "stale" && !at.Add(72*time.Hour).Before(began) && !at.Add(72*time.Hour).After(a.at):
					before++
				default:
					t.Errorf("event time %v arrived at %v", at, a.at)
				}
				if after > 0 && at.Before(began) {
					t.Errorf("the clock went wrong again after it was set: %v at %v", at, a.at)
				}
			}
			if before == 0 || after == 0 {
				t.Errorf("%d publications before the clock was set, %d after; want both", before, after)
			}
		})
	}
}

// TestDuplicatesSent: with DuplicateProb 1 every publication goes out
// twice, back to back, as two publications; the truth log says which is
// the duplicate.
func TestDuplicatesSent(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "dup", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{DuplicateProb: 1}}
	_, truth := runFor(t, addr, dev, 500*time.Millisecond)
	got := w.of("dup")
	if len(got) < 10 || len(got)%2 != 0 || len(truth) != len(got) {
		t.Fatalf("%d publications, %d truth records", len(got), len(truth))
	}
	for i := 0; i < len(got); i += 2 {
		if got[i].payload != got[i+1].payload {
			t.Errorf("#%d not repeated: %s then %s", i, got[i].payload, got[i+1].payload)
		}
		if truth[i].Kind != firmwaresim.KindReading || truth[i+1].Kind != firmwaresim.KindDuplicate || !truth[i+1].Counted() {
			t.Errorf("#%d truth kinds %s, %s", i, truth[i].Kind, truth[i+1].Kind)
		}
	}
}

// TestReorderWithinBound: publications leave out of order, but none more
// than the bound behind one sent before it.
func TestReorderWithinBound(t *testing.T) {
	addr, w := startBroker(t)
	const bound = 200 * time.Millisecond
	dev := firmwaresim.Device{ID: "reo", Metrics: oneMetric(), Interval: 10 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{ReorderWithin: bound}}
	_, truth := runFor(t, addr, dev, 1500*time.Millisecond)
	got := w.of("reo")
	inversions := 0
	var latest time.Time
	for _, a := range got {
		et := eventTime(t, a.payload)
		if et.Before(latest) {
			inversions++
			if latest.Sub(et) > bound+20*time.Millisecond {
				t.Errorf("reading of %v sent after one of %v: beyond the bound", et, latest)
			}
		}
		if et.After(latest) {
			latest = et
		}
	}
	if inversions < 10 || len(got) != len(truth) {
		t.Errorf("%d inversions in %d publications (%d in the truth log)", inversions, len(got), len(truth))
	}
}

// TestMalformedSent: with MalformedProb 1 every payload is one of the
// undecodable ones, and the truth log records no reading for it.
func TestMalformedSent(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "bad", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Behaviour: firmwaresim.Behaviour{MalformedProb: 1}}
	_, truth := runFor(t, addr, dev, 400*time.Millisecond)
	got := w.of("bad")
	if len(got) < 5 || len(got) != len(truth) {
		t.Fatalf("%d publications, %d truth records", len(got), len(truth))
	}
	for i, a := range got {
		var v struct {
			V *float64 `json:"v"`
		}
		if json.Unmarshal([]byte(a.payload), &v) == nil && v.V != nil {
			t.Errorf("#%d decodes: %q", i, a.payload)
		}
		if truth[i].Kind != firmwaresim.KindMalformed || truth[i].Counted() {
			t.Errorf("#%d truth %+v", i, truth[i])
		}
	}
}

// TestMQTT311Device: a 3.1.1 device connects as protocol 4 and publishes
// at its QoS.
func TestMQTT311Device(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "old", Metrics: firmwaresim.Environmental(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormObject, Protocol: 4}
	_, truth := runFor(t, addr, dev, 300*time.Millisecond)
	got := w.of("old")
	if len(got) < 5 || len(truth) != 3*len(got) {
		t.Fatalf("%d publications, %d readings in the truth log", len(got), len(truth))
	}
	for _, a := range got {
		if a.protocol != 4 || a.qos != 1 {
			t.Fatalf("protocol %d qos %d", a.protocol, a.qos)
		}
	}
	for _, s := range truth {
		if !s.Acked {
			t.Errorf("not acknowledged: %+v", s)
		}
	}
}

// TestReconnectStorm: every device drops and reconnects at each storm,
// and no acknowledged reading is lost.
func TestReconnectStorm(t *testing.T) {
	addr, w := startBroker(t)
	f := firmwaresim.NewFleet(addr, 20, "st", 30*time.Millisecond, 1)
	f.StormEvery = 250 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 1100*time.Millisecond)
	defer cancel()
	f.Run(ctx)
	st := f.Stats()
	if st.Storms != 4 {
		t.Fatalf("%d storms, want 4", st.Storms)
	}
	w.mu.Lock()
	for _, d := range f.Devices {
		if n := w.conn[d.ID]; n != 5 {
			t.Errorf("%s connected %d times, want 5", d.ID, n)
		}
	}
	w.mu.Unlock()
	acked := 0
	for _, s := range f.Truth.Sent() {
		if s.Acked {
			acked++
		}
	}
	if acked == 0 || uint64(acked) != st.Acked {
		t.Errorf("acked %d in the truth, %d counted", acked, st.Acked)
	}
}

// TestSlowConsumer: a subscriber that takes 20 ms per message receives
// the fleet's publications at its own pace, without slowing the devices
// down, and stops as soon as the fleet does.
func TestSlowConsumer(t *testing.T) {
	addr, w := startBroker(t)
	f := firmwaresim.NewFleet(addr, 4, "sc", 20*time.Millisecond, 1)
	f.Subscribers = []firmwaresim.Subscriber{{ID: "dash", Filter: "sensors/#", Delay: 20 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	f.Run(ctx)
	took := time.Since(start)
	st := f.Stats()
	w.mu.Lock()
	published := len(w.got)
	w.mu.Unlock()
	// At 20 ms a message it reads about 50 a second; the devices publish
	// 4 × 50 a second.
	if st.Received < 10 || published < 4*30 || took > 3*time.Second {
		t.Errorf("subscriber received %d, devices published %d, run took %v", st.Received, published, took)
	}
	t.Logf("slow subscriber received %d while devices published %d", st.Received, published)
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after a minute", what)
		}
	}
}

// TestHoldThenFixedLoad: held devices connect and send nothing; once
// released, each takes exactly Samples samples and then stays connected
// without sending more: the broker receives devices × Samples × metrics
// publications, no more.
func TestHoldThenFixedLoad(t *testing.T) {
	addr, w := startBroker(t)
	hold := make(chan struct{})
	const devices, samples = 4, 10
	f := firmwaresim.NewFleet(addr, devices, "hold", 5*time.Millisecond, 1)
	f.Hold = hold
	metrics := 0
	for i := range f.Devices {
		f.Devices[i].Samples = samples
		f.Devices[i].Form = firmwaresim.FormBare // one publication per reading
		metrics = len(f.Devices[i].Metrics)
	}
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	received := func() int { w.mu.Lock(); defer w.mu.Unlock(); return len(w.got) }

	waitFor(t, "every device to connect", func() bool { return f.Stats().Connects == devices })
	time.Sleep(20 * 5 * time.Millisecond) // twenty sample intervals
	if n := received(); n != 0 || f.Stats().Sent != 0 {
		t.Fatalf("held fleet sent %d publications (%d counted)", n, f.Stats().Sent)
	}
	close(hold)
	want := devices * samples * metrics
	waitFor(t, "the fixed load", func() bool { return received() >= want })
	time.Sleep(20 * 5 * time.Millisecond)
	if n, st := received(), f.Stats(); n != want || st.Sent != uint64(want) || st.Acked != uint64(want) || st.Connects != devices {
		t.Errorf("broker received %d, fleet counted sent %d acked %d connects %d; want %d publications on %d connections",
			n, st.Sent, st.Acked, st.Connects, want, devices)
	}
	for _, d := range f.Devices {
		if n := len(w.of(d.ID)); n != samples*metrics {
			t.Errorf("%s: %d publications, want %d", d.ID, n, samples*metrics)
		}
	}
}
