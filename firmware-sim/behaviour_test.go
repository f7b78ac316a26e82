package firmwaresim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
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
	// close stops the broker once it has finished with every client, so
	// that every hook has run; it is safe to call again.
	close func()
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
	w := &wire{conn: map[string]int{}}
	b := startMochi(t, w, false)
	w.close = b.Close
	return b.Addr(), w
}

// runUntil runs a fleet of one device until done holds, however long
// that takes (failing after a minute, as waitFor does), then stops it and
// returns its truth log. With Device.Samples, done can wait for the last
// reading, so that the counts are exact.
func runUntil(t *testing.T, addr string, dev firmwaresim.Device, what string, done func(*firmwaresim.Fleet) bool) (*firmwaresim.Fleet, []firmwaresim.Sent) {
	t.Helper()
	f := &firmwaresim.Fleet{Addr: addr, Devices: []firmwaresim.Device{dev}, Truth: &firmwaresim.Truth{}, Seed: 7}
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { f.Run(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	waitFor(t, what, func() bool { return done(f) })
	cancel()
	<-stopped
	return f, f.Truth.Sent()
}

// acked is a runUntil condition: n readings sent and acknowledged.
func acked(n int) func(*firmwaresim.Fleet) bool {
	return func(f *firmwaresim.Fleet) bool { return f.Stats().Acked >= uint64(n) }
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
// and every reading sampled arrives once. It takes 100 samples, at least
// 2 s at its interval (three outages or more, the slower it runs the
// more), and the test waits for the last, however long that takes.
func TestOfflineReplayInOrder(t *testing.T) {
	addr, w := startBroker(t)
	const samples = 100
	dev := firmwaresim.Device{ID: "off", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT, Samples: samples,
		Behaviour: firmwaresim.Behaviour{OfflineEvery: 600 * time.Millisecond, OfflineFor: 300 * time.Millisecond}}
	_, truth := runUntil(t, addr, dev, "every reading to be acknowledged", acked(samples))
	got := w.of("off")
	if len(got) != samples || len(truth) != samples {
		t.Fatalf("%d on the wire, %d in the truth log; want %d", len(got), len(truth), samples)
	}
	var maxGap time.Duration
	type span struct{ from, to time.Time }
	var silences []span // at least 250 ms with nothing on the wire: outages
	for i := range got {
		if i > 0 {
			if !eventTime(t, got[i].payload).After(eventTime(t, got[i-1].payload)) {
				t.Fatalf("#%d out of order: %s after %s", i, got[i].payload, got[i-1].payload)
			}
			gap := got[i].at.Sub(got[i-1].at)
			maxGap = max(maxGap, gap)
			if gap >= 250*time.Millisecond {
				silences = append(silences, span{got[i-1].at, got[i].at})
			}
		}
		if truth[i].Value != mustValue(t, got[i].payload) || !truth[i].Acked {
			t.Errorf("#%d: wire %s, truth %+v", i, got[i].payload, truth[i])
		}
	}
	// Readings sampled during a silence were buffered, and sent after it.
	replayed := 0
	for _, a := range got {
		et := eventTime(t, a.payload)
		for _, s := range silences {
			if et.After(s.from) && et.Before(s.to) {
				replayed++
			}
		}
	}
	if maxGap < 250*time.Millisecond || replayed < 10 {
		t.Errorf("longest silence %v, %d readings sampled in %d silences and replayed; want outages of ~300ms and a replay", maxGap, replayed, len(silences))
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
	// The device takes 300 samples, at least 3 s at its interval: its
	// first outage ends by 2.55 s whatever its phase, so it samples on
	// into the replay. The test waits for the last reading, however long
	// that takes.
	const samples = 300
	// Slow the replay down with many metrics per sample so live samples
	// land in the middle of it.
	var ms []firmwaresim.Metric
	for range 10 {
		ms = append(ms, oneMetric()...)
	}
	for i := range ms {
		ms[i].Name = string(rune('a' + i))
	}
	dev := firmwaresim.Device{ID: "inter", Metrics: ms, Interval: 10 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT, Samples: samples,
		Behaviour: firmwaresim.Behaviour{OfflineEvery: 1500 * time.Millisecond, OfflineFor: 700 * time.Millisecond, Interleave: true}}
	_, truth := runUntil(t, addr, dev, "every reading to be acknowledged", acked(samples*len(ms)))
	got := w.of("inter")
	if len(got) != samples*len(ms) || len(truth) != len(got) {
		t.Fatalf("%d on the wire, %d in the truth log; want %d", len(got), len(truth), samples*len(ms))
	}
	backwards := 0
	once := map[string]bool{} // metric and event time: every reading arrived exactly once
	var prev time.Time
	for i, a := range got {
		et := eventTime(t, a.payload)
		if i > 0 && et.Before(prev) {
			backwards++
		}
		prev = et
		if k := a.topic + " " + et.String(); once[k] {
			t.Errorf("#%d sent again: %s %s", i, a.topic, a.payload)
		} else {
			once[k] = true
		}
		if s := truth[i]; s.Topic != a.topic || !s.Time.Equal(et) || s.Value != mustValue(t, a.payload) || !s.Acked {
			t.Errorf("#%d: wire %s %s, truth %+v", i, a.topic, a.payload, s)
		}
	}
	if backwards == 0 {
		t.Error("no live reading overtook the buffer")
	}
	t.Logf("%d publications, %d times the event time went back", len(got), backwards)
}

// TestClockSkewAndDrift: the event time in the payload is the device's
// clock: 90 s ahead of the wire arrival, and with drift, ahead by more as
// time goes on.
func TestClockSkewAndDrift(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "skew", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Samples: 50, Behaviour: firmwaresim.Behaviour{ClockSkew: 90 * time.Second, ClockDrift: 0.5}}
	runUntil(t, addr, dev, "every reading to be acknowledged", acked(50))
	got := w.of("skew")
	if len(got) != 50 {
		t.Fatalf("%d publications, want 50", len(got))
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
// reading is sampled after the test began and before it arrived. The test
// runs until ten readings stamped after the clock was set are
// acknowledged, however long that takes.
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
			setAt := began.Add(stepAt).Truncate(time.Millisecond) // event times are to the millisecond
			runUntil(t, addr, dev, "ten readings stamped after the clock was set", func(f *firmwaresim.Fleet) bool {
				n := 0
				for _, s := range f.Truth.Sent() {
					if s.Acked && !s.Time.Before(setAt) {
						n++
					}
				}
				return n >= 10
			})
			before, after := 0, 0
			for _, a := range w.of(name) {
				at := eventTime(t, a.payload)
				switch {
				case !at.Before(setAt) && !at.After(a.at): // set: true time, sampled before it arrived
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
// the duplicate. The test waits for the last of 20 samples, so that it
// never stops the device between a publication and its duplicate.
func TestDuplicatesSent(t *testing.T) {
	addr, w := startBroker(t)
	const samples = 20
	dev := firmwaresim.Device{ID: "dup", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT, Samples: samples,
		Behaviour: firmwaresim.Behaviour{DuplicateProb: 1}}
	_, truth := runUntil(t, addr, dev, "every reading and duplicate to be acknowledged", acked(2*samples))
	got := w.of("dup")
	if len(got) != 2*samples || len(truth) != len(got) {
		t.Fatalf("%d publications, %d truth records; want %d", len(got), len(truth), 2*samples)
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
// than the bound behind one sent before it. That holds however slowly the
// machine runs: each is held back from its sample for up to the bound,
// and they are sent in the order they are due, so one sampled later and
// sent first was due no later. Event times are to the millisecond of the
// wall clock: a millisecond for that, and one for the clock's slewing.
func TestReorderWithinBound(t *testing.T) {
	addr, w := startBroker(t)
	const bound = 200 * time.Millisecond
	const samples = 150
	dev := firmwaresim.Device{ID: "reo", Metrics: oneMetric(), Interval: 10 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT, Samples: samples,
		Behaviour: firmwaresim.Behaviour{ReorderWithin: bound}}
	_, truth := runUntil(t, addr, dev, "every reading to be acknowledged", acked(samples))
	got := w.of("reo")
	inversions := 0
	var latest time.Time
	for _, a := range got {
		et := eventTime(t, a.payload)
		if et.Before(latest) {
			inversions++
			if latest.Sub(et) > bound+2*time.Millisecond {
				t.Errorf("reading of %v sent after one of %v: beyond the bound", et, latest)
			}
		}
		if et.After(latest) {
			latest = et
		}
	}
	if inversions < 10 || len(got) != samples || len(truth) != samples {
		t.Errorf("%d inversions in %d publications (%d in the truth log); want %d publications", inversions, len(got), len(truth), samples)
	}
}

// TestMalformedSent: with MalformedProb 1 every payload is one of the
// undecodable ones, and the truth log records no reading for it.
func TestMalformedSent(t *testing.T) {
	addr, w := startBroker(t)
	dev := firmwaresim.Device{ID: "bad", Metrics: oneMetric(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormVT,
		Samples: 10, Behaviour: firmwaresim.Behaviour{MalformedProb: 1}}
	// Malformed publications are no readings: Stats does not count them,
	// the truth log does.
	_, truth := runUntil(t, addr, dev, "every publication to be sent", func(f *firmwaresim.Fleet) bool { return len(f.Truth.Sent()) >= 10 })
	got := w.of("bad")
	if len(got) != 10 || len(got) != len(truth) {
		t.Fatalf("%d publications, %d truth records; want 10", len(got), len(truth))
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
	dev := firmwaresim.Device{ID: "old", Metrics: firmwaresim.Environmental(), Interval: 20 * time.Millisecond, QoS: 1, Form: firmwaresim.FormObject, Protocol: 4, Samples: 5}
	_, truth := runUntil(t, addr, dev, "every reading to be acknowledged", acked(5*3))
	got := w.of("old")
	if len(got) != 5 || len(truth) != 3*len(got) {
		t.Fatalf("%d publications, %d readings in the truth log; want 5 and 15", len(got), len(truth))
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
// and no acknowledged reading is lost. Each storm starts once the whole
// fleet is back from the one before, however long that takes, so the
// counts are exact: the broker sees each device connect once, then once
// per storm.
func TestReconnectStorm(t *testing.T) {
	addr, w := startBroker(t)
	const devices, storms = 20, 4
	f := firmwaresim.NewFleet(addr, devices, "st", 30*time.Millisecond, 1)
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "every device to connect", func() bool { return f.Stats().Connects >= devices })
	for i := 1; i <= storms; i++ {
		f.Storm()
		waitFor(t, fmt.Sprintf("every device to reconnect after storm %d", i), func() bool { return f.Stats().Connects >= devices*uint64(i+1) })
		// Some readings go out between storms.
		sent := f.Stats().Acked
		waitFor(t, fmt.Sprintf("readings after storm %d", i), func() bool { return f.Stats().Acked > sent })
	}
	cancel()
	<-done
	w.close() // every connection the broker took is counted
	f.Storm() // after the run: no storm, none counted

	st := f.Stats()
	if st.Storms != storms || st.Connects != devices*(storms+1) || st.Errors != 0 {
		t.Errorf("fleet counted %d storms, %d connections, %d errors; want %d, %d, 0", st.Storms, st.Connects, st.Errors, storms, devices*(storms+1))
	}
	truth := f.Truth.Sent()
	for _, d := range f.Devices {
		w.mu.Lock()
		n := w.conn[d.ID]
		w.mu.Unlock()
		if n != storms+1 {
			t.Errorf("%s connected %d times, want %d", d.ID, n, storms+1)
		}
		// Every reading the device sent was acknowledged and is on the
		// wire: one publication each in the bare and v+t forms, one for
		// all of a sample's in the others.
		readings := 0
		for _, s := range truth {
			if s.Device == d.ID {
				readings++
				if !s.Acked {
					t.Errorf("%s: not acknowledged: %+v", d.ID, s)
				}
			}
		}
		perPub := len(d.Metrics)
		if d.Form == firmwaresim.FormBare || d.Form == firmwaresim.FormVT {
			perPub = 1
		}
		if n := len(w.of(d.ID)); readings%perPub != 0 || n != readings/perPub {
			t.Errorf("%s (%s): %d publications on the wire, %d readings in the truth log", d.ID, d.Form, n, readings)
		}
	}
	if uint64(len(truth)) != st.Acked {
		t.Errorf("%d readings in the truth log, %d counted acknowledged", len(truth), st.Acked)
	}
}

// TestSlowConsumer: a subscriber that takes 100 ms per message receives
// the fleet's publications at its own pace, without slowing the devices
// down, and stops as soon as the fleet does. The devices start once it
// has subscribed and take 25 samples each, half a second's worth; the test
// waits for the last, however long that takes.
func TestSlowConsumer(t *testing.T) {
	addr, w := startBroker(t)
	const devices, samples, delay = 4, 25, 100 * time.Millisecond
	hold := make(chan struct{})
	f := firmwaresim.NewFleet(addr, devices, "sc", 20*time.Millisecond, 1)
	f.Hold = hold
	f.Subscribers = []firmwaresim.Subscriber{{ID: "dash", Filter: "sensors/#", Delay: delay}}
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	readings, publications := 0, 0
	for i := range f.Devices {
		d := &f.Devices[i]
		d.Samples = samples
		readings += samples * len(d.Metrics)
		if d.Form == firmwaresim.FormBare || d.Form == firmwaresim.FormVT {
			publications += samples * len(d.Metrics) // one per reading
		} else {
			publications += samples // one per sample
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "the devices and the subscriber to connect", func() bool { return f.Stats().Connects >= devices+1 })
	close(hold)
	released := time.Now()
	waitFor(t, "every reading to be acknowledged, and the subscriber to receive", func() bool {
		st := f.Stats()
		return st.Acked >= uint64(readings) && st.Received > 0
	})
	received := f.Stats().Received
	el := time.Since(released)
	cancel()
	stop := time.Now()
	<-done
	took := time.Since(stop)
	w.mu.Lock()
	published := len(w.got)
	w.mu.Unlock()
	// It reads a message, then takes 100 ms over it: however slowly the
	// machine runs, it cannot have read more than one per 100 ms since the
	// devices began. At that pace it would take 20 s to read them all; the
	// devices did not wait for it. Stopping, it does not read on through
	// the messages it has been sent (64 at a time, 6.4 s).
	if st := f.Stats(); published != publications || st.Acked != uint64(readings) || received > 1+uint64(el/delay) || received >= uint64(publications) || took > 2*time.Second {
		t.Errorf("devices published %d (%d readings acknowledged), subscriber received %d in %v, stopped in %v; want %d publications, %d readings, at most one per %v",
			published, st.Acked, received, el, took, publications, readings, delay)
	}
	t.Logf("slow subscriber received %d of %d publications in %v", received, published, el)
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
