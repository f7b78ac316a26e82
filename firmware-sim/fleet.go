// Package firmwaresim (folder firmware-sim) simulates sensor devices for
// tests, demos and load: a Fleet of MQTT devices built on eclipse/paho.golang
// that publish realistic signals in every payload form the gateway accepts,
// and a Truth log of what each device sent and which sends were
// acknowledged, so that a test can compute the expected summaries on its
// own.
//
// The package knows nothing of the gateway: it speaks MQTT to an address.
package firmwaresim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Form is a payload form.
type Form int

const (
	FormBare   Form = iota // sensors/{device}/{metric}: 21.5 (arrival time)
	FormVT                 // sensors/{device}/{metric}: {"v":21.5,"t":"RFC 3339"}
	FormObject             // sensors/{device}: {"t":..,"temp_c":21.5,"rh":40}
	FormSenML              // sensors/{device}: SenML pack
	// FormSparkplug is a Sparkplug B edge node (see sparkplug.go):
	// spBv1.0/<group>/DDATA/<id>/sensor, by alias, with births.
	FormSparkplug
)

func (f Form) String() string {
	switch f {
	case FormBare:
		return "bare"
	case FormVT:
		return "v+t"
	case FormObject:
		return "object"
	case FormSenML:
		return "senml"
	case FormSparkplug:
		return "sparkplug"
	}
	return "form(" + strconv.Itoa(int(f)) + ")"
}

// Signal generates a metric's values: a base level with a slow drift, a
// sine cycle and Gaussian noise, rounded to the sensor's resolution.
type Signal struct {
	Base       float64
	Drift      float64 // per hour
	Amplitude  float64
	Period     time.Duration
	Noise      float64 // standard deviation
	Resolution float64 // e.g. 0.01; 0 keeps full precision
	// Every StepEvery the level steps by StepSize, up then down again (a
	// door opening, a heater switching).
	StepEvery time.Duration
	StepSize  float64
}

// At returns the signal's value at t, with noise drawn from rng.
func (s Signal) At(t time.Time, rng *rand.Rand) float64 {
	secs := float64(t.UnixNano()) / 1e9
	v := s.Base + s.Drift*math.Mod(secs, 86400)/3600
	if s.Period > 0 {
		v += s.Amplitude * math.Sin(2*math.Pi*secs/s.Period.Seconds())
	}
	if s.StepEvery > 0 && int64(secs/s.StepEvery.Seconds())%2 == 1 {
		v += s.StepSize
	}
	if s.Noise > 0 {
		v += rng.NormFloat64() * s.Noise
	}
	if s.Resolution > 0 {
		v = math.Round(v/s.Resolution) * s.Resolution
		v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'f', decimals(s.Resolution), 64), 64)
	}
	return v
}

func decimals(res float64) int {
	d := 0
	for res < 1 && d < 9 {
		res *= 10
		d++
	}
	return d
}

// Metric is one measured quantity of a device.
type Metric struct {
	Name   string
	Unit   string
	Signal Signal
}

// Device is one simulated device.
type Device struct {
	ID       string
	Username string // empty for anonymous
	Password string
	Metrics  []Metric
	Interval time.Duration // between samples
	QoS      byte
	Form     Form
	Prefix   string // topic prefix; default "sensors"
	// Samples, if set, is how many samples the device takes; after the
	// last it keeps its connection and sends nothing more. A fleet of
	// such devices offers a fixed load: Samples × len(Metrics) readings
	// each.
	Samples int
	// Protocol is the MQTT version: 5 (the default, eclipse/paho.golang)
	// or 4 for 3.1.1 (eclipse/paho.mqtt.golang), as many field devices
	// still speak.
	Protocol byte
	Behaviour
}

// Behaviour is how a device's firmware departs from the ideal.
type Behaviour struct {
	// Every OfflineEvery (from a random phase) the device loses its
	// network for OfflineFor: it disconnects and keeps taking readings in
	// an ordered buffer, which it replays oldest first when it is back.
	// With Interleave, readings taken during the replay are sent at once,
	// ahead of the rest of the buffer, as firmware with a live channel
	// does; without, they queue behind it.
	OfflineEvery, OfflineFor time.Duration
	Interleave               bool
	// The device's clock runs ClockSkew ahead of true time (negative:
	// behind) and gains ClockDrift seconds per second from the fleet's
	// start. Event times in payloads come from this clock.
	ClockSkew  time.Duration
	ClockDrift float64
	// ClockUnset: the device's clock was never set, and counts from 1970
	// at the fleet's start (an ESP32 before SNTP). ClockOffset sets it
	// that far from true time instead (negative: behind, a stale saved
	// time). At ClockStepAt after the fleet's start (if set) the clock is
	// set right, as NTP or SNTP does once it answers: it steps to true
	// time, forward or back, and keeps it.
	ClockUnset  bool
	ClockOffset time.Duration
	ClockStepAt time.Duration
	// DuplicateProb is the chance that a publication is sent twice (a
	// firmware retry bug: the second is a new publication, not a DUP).
	DuplicateProb float64
	// ReorderWithin delays each publication by a random time up to this
	// bound before it is sent, so publications leave out of order, none
	// more than this late.
	ReorderWithin time.Duration
	// MalformedProb is the chance that a publication's payload is
	// replaced by one the gateway cannot decode.
	MalformedProb float64
	// AliasLossProb is, for a Sparkplug edge node, the chance that a
	// sample renumbers its aliases without a rebirth, until the gateway
	// asks for one.
	AliasLossProb float64
}

// Kinds of truth records.
const (
	KindReading   = "reading"   // a reading as sampled
	KindDuplicate = "duplicate" // the same reading sent again
	KindMalformed = "malformed" // a payload that cannot be decoded; no reading
)

// Sent is one reading a device tried to send (or, with KindMalformed, one
// undecodable publication).
type Sent struct {
	Device string    `json:"device"`
	Metric string    `json:"metric,omitempty"`
	Unit   string    `json:"unit,omitempty"`
	Time   time.Time `json:"t"` // event time as encoded in the payload (arrival time is unknown for the bare form)
	Value  float64   `json:"v"`
	QoS    byte      `json:"qos"`
	Acked  bool      `json:"acked"` // QoS > 0 and acknowledged with success
	Err    string    `json:"err,omitempty"`
	Kind   string    `json:"kind"`
	Topic  string    `json:"topic"`
	Bare   bool      `json:"bare,omitempty"` // the payload carried no time: the gateway stamps its arrival
	// SendStart and SentAt are the wall times the attempt began and ended:
	// the gateway received it in between.
	SendStart time.Time `json:"send_start"`
	SentAt    time.Time `json:"sent_at"`
	Form      string    `json:"form,omitempty"`
}

// Counted reports whether the gateway must count this reading exactly
// once: a QoS 1/2 reading it acknowledged, or a QoS 0 reading written
// without error (QoS 0 is best effort by the protocol, but on a healthy
// link it arrives).
func (s Sent) Counted() bool {
	if s.Kind == KindMalformed || s.Kind == KindAliasLost {
		return false
	}
	if s.QoS > 0 {
		return s.Acked
	}
	return s.Err == ""
}

// Truth records what the fleet sent: in memory, and as JSON lines to W if
// set. It is safe for concurrent use.
type Truth struct {
	W io.Writer

	mu   sync.Mutex
	sent []Sent
	buf  []byte
	err  error
}

func (t *Truth) add(s []Sent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent = append(t.sent, s...)
	if t.W == nil || t.err != nil {
		return
	}
	t.buf = t.buf[:0]
	for _, x := range s {
		b, _ := json.Marshal(x)
		t.buf = append(append(t.buf, b...), '\n')
	}
	if _, err := t.W.Write(t.buf); err != nil {
		t.err = fmt.Errorf("write truth log: %w", err)
	}
}

// Err returns the first error writing the log.
func (t *Truth) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Sent returns a copy of the records so far.
func (t *Truth) Sent() []Sent {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Sent(nil), t.sent...)
}

// ReadTruth reads a truth log written as JSON lines.
func ReadTruth(r io.Reader) ([]Sent, error) {
	var out []Sent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var s Sent
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("truth log line %d: %w", n, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read truth log: %w", err)
	}
	return out, nil
}

// Subscriber is a local consumer, such as a dashboard, that subscribes to
// Filter and takes Delay over each message it receives: a slow consumer.
type Subscriber struct {
	ID, Username, Password string
	Filter                 string
	Delay                  time.Duration
}

// Fleet runs devices against one broker address.
type Fleet struct {
	Addr        string
	Devices     []Device
	Subscribers []Subscriber
	Truth       *Truth           // optional
	Now         func() time.Time // default time.Now
	Seed        uint64
	// StormEvery, if set, drops every device's connection at once this
	// often (from the start), and they all reconnect at once: a reconnect
	// storm, as after a gateway reboot or a Wi-Fi outage. Storm starts one
	// at a chosen moment instead.
	StormEvery time.Duration
	// OnError, if set, receives connection and publish errors; the device
	// reconnects after a pause.
	OnError func(device string, err error)
	// Hold, if set, keeps every device from sampling until it is closed:
	// devices connect at once and stay idle meanwhile (keep-alives only),
	// so that idle connections can be measured, or a load can start only
	// once the whole fleet is connected.
	Hold <-chan struct{}

	sent, acked, errs, connects, received, buffered atomic.Uint64
	ackLatency                                      [latencyBuckets + 1]atomic.Uint64 // 100 µs buckets; the last is ≥ 100 ms

	stormMu sync.Mutex
	storm   chan struct{} // closed at each storm, then replaced; nil when not running
	storms  atomic.Uint64
}

const latencyBuckets = 1000 // of 100 µs: up to 100 ms

func (f *Fleet) recordAck(d time.Duration) {
	f.ackLatency[min(int(d/(100*time.Microsecond)), latencyBuckets)].Add(1)
}

// AckLatency returns the q-quantile (0 < q < 1) of the time from sending a
// QoS > 0 publication to its acknowledgement, to 0.1 ms (the upper edge of
// its bucket; ≥ 100 ms reads as 100 ms). It is 0 before any.
func (f *Fleet) AckLatency(q float64) time.Duration {
	var counts [latencyBuckets + 1]uint64
	var total uint64
	for i := range counts {
		counts[i] = f.ackLatency[i].Load()
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q * float64(total))
	var seen uint64
	for i, n := range counts {
		seen += n
		if seen > rank {
			return time.Duration(min(i+1, latencyBuckets)) * 100 * time.Microsecond
		}
	}
	return latencyBuckets * 100 * time.Microsecond
}

// FleetStats counts what a fleet has done so far.
type FleetStats struct {
	Sent     uint64 // readings published
	Acked    uint64 // readings acknowledged (QoS > 0)
	Errors   uint64 // connection and publish errors
	Connects uint64 // successful connections, first ones included
	Buffered uint64 // publications waiting in devices' buffers (offline, or behind a replay)
	Received uint64 // messages the subscribers received
	Storms   uint64 // reconnect storms so far
}

// Stats returns the fleet's counters; safe to call while it runs.
func (f *Fleet) Stats() FleetStats {
	return FleetStats{Sent: f.sent.Load(), Acked: f.acked.Load(), Errors: f.errs.Load(), Connects: f.connects.Load(),
		Buffered: f.buffered.Load(), Received: f.received.Load(), Storms: f.storms.Load()}
}

// Run runs every device and subscriber until ctx is cancelled, then
// disconnects them.
func (f *Fleet) Run(ctx context.Context) error {
	now := f.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	f.stormMu.Lock()
	f.storm = make(chan struct{})
	f.stormMu.Unlock()
	var wg sync.WaitGroup
	if f.StormEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(f.StormEvery)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					f.Storm()
				}
			}
		}()
	}
	for _, sub := range f.Subscribers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.runSubscriber(ctx, sub)
		}()
	}
	for i, d := range f.Devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(f.Seed, uint64(i)))
			dv := &device{f: f, d: d, rng: rng, now: now, start: start}
			if d.Form == FormSparkplug {
				dv.sp = newSpState(d)
			}
			dv.run(ctx)
		}()
	}
	wg.Wait()
	f.stormMu.Lock()
	f.storm = nil
	f.stormMu.Unlock()
	return nil
}

// Storm drops every device's connection at once, now, as StormEvery does
// on its schedule: each device that is connected disconnects and
// reconnects, and Stats counts the storm. A device that is connecting
// meanwhile reconnects once it is through; one busy sending notices when
// the send is done, and storms that came meanwhile are one to it, as it
// had one connection to lose. It does nothing unless Run is running.
func (f *Fleet) Storm() {
	f.stormMu.Lock()
	defer f.stormMu.Unlock()
	if f.storm == nil {
		return
	}
	close(f.storm)
	f.storm = make(chan struct{})
	f.storms.Add(1) // under the lock: a device that sees the storm sees it counted
}

func (f *Fleet) stormCh() <-chan struct{} {
	f.stormMu.Lock()
	defer f.stormMu.Unlock()
	return f.storm
}

func (f *Fleet) report(dev string, err error) {
	f.errs.Add(1)
	if f.OnError != nil && err != nil {
		f.OnError(dev, err)
	}
}

// outMsg is a publication waiting to be sent, with the truth records of
// what it carries.
type outMsg struct {
	Message
	sent []Sent
	due  time.Time // release time, when reordered
	// historical: taken while offline (Sparkplug's is_historical).
	historical bool
}

// device is one device's firmware loop: it samples on its timer, goes
// offline and back on its schedule, and sends its queues in order. One
// goroutine runs it, so its queues need no lock.
type device struct {
	f     *Fleet
	d     Device
	rng   *rand.Rand
	now   func() time.Time
	start time.Time

	c       conn
	online  bool
	backlog []outMsg // taken while offline (or queued behind them): replayed oldest first
	live    []outMsg // taken while online
	delayed []outMsg // held back to leave out of order (ReorderWithin), by due time

	sp *spState // a Sparkplug edge node's session; nil for other forms
}

// clock is the device's own clock: skewed and drifting, or unset or off
// until it is set at ClockStepAt.
func (dv *device) clock(t time.Time) time.Time {
	up := t.Sub(dv.start)
	switch d := dv.d; {
	case d.ClockStepAt > 0 && up >= d.ClockStepAt:
		return t
	case d.ClockUnset:
		return time.Unix(0, 0).UTC().Add(up)
	}
	return t.Add(dv.d.ClockOffset + dv.d.ClockSkew + time.Duration(dv.d.ClockDrift*float64(up)))
}

func (dv *device) pending() int {
	n := len(dv.backlog) + len(dv.live)
	if dv.sp != nil {
		n += len(dv.sp.births)
	}
	return n
}

// rebirths is the channel of an edge node's rebirth requests (nil, never
// ready, for other forms).
func (dv *device) rebirths() <-chan struct{} {
	if dv.sp == nil {
		return nil
	}
	return dv.sp.rebirth
}

func (dv *device) run(ctx context.Context) {
	d, f := dv.d, dv.f
	defer func() {
		if dv.c != nil {
			dv.c.close()
		}
		f.buffered.Add(-uint64(dv.pending() + len(dv.delayed))) // what is left is not sent
	}()
	// Taken before the first connection, as before each reconnection, so
	// that a storm while connecting is not missed; refreshed only once a
	// storm is seen, so none is missed while sending either.
	storm := f.stormCh()
	// Connect at once, as a device does when it boots, then sample at a
	// random phase so a fleet does not publish in lockstep.
	dv.online = true
	dv.connect(ctx)
	phase := time.Duration(dv.rng.Int64N(int64(d.Interval) + 1))
	sample := time.NewTimer(phase)
	defer sample.Stop()
	hold := f.Hold
	if hold != nil {
		sample.Stop() // started when the hold is released
	}
	taken := 0
	offline := time.NewTimer(time.Hour)
	offline.Stop()
	if d.OfflineEvery > 0 && d.OfflineFor > 0 {
		offline.Reset(time.Duration(dv.rng.Int64N(int64(d.OfflineEvery))) + d.OfflineFor/2)
	}
	defer offline.Stop()
	release := time.NewTimer(time.Hour)
	release.Stop()
	defer release.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	retrying := false
	for {
		if len(dv.delayed) > 0 {
			release.Reset(max(0, dv.delayed[0].due.Sub(dv.now())))
		}
		if dv.online && dv.c == nil && !retrying {
			retry.Reset(200 * time.Millisecond)
			retrying = true
		}
		// With something to send, the send case is always ready: due
		// events and sends take turns.
		var send <-chan struct{}
		if dv.online && dv.c != nil && dv.pending() > 0 {
			send = ready
		}
		select {
		case <-ctx.Done():
			return
		case <-send:
			dv.sendOne(ctx) // on failure the connection is dropped, and retried above
		case <-hold:
			hold = nil
			sample.Reset(phase)
		case <-sample.C:
			taken++
			if d.Samples == 0 || taken < d.Samples {
				sample.Reset(d.Interval)
			}
			dv.sample()
		case <-offline.C:
			dv.toggle(ctx, offline)
		case <-release.C:
			dv.release()
		case <-storm:
			storm = f.stormCh()
			if dv.c != nil {
				dv.drop()
				dv.connect(ctx)
			}
		case <-retry.C:
			retrying = false
			if dv.online && dv.c == nil {
				dv.connect(ctx)
			}
		case <-dv.rebirths():
			if len(dv.sp.births) == 0 {
				dv.sp.queueBirths()
			}
		}
	}
}

// ready is always ready to receive from.
var ready = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// connect (re)connects; on failure the device retries later.
func (dv *device) connect(ctx context.Context) {
	var sess *session
	if sp := dv.sp; sp != nil {
		sp.bdSeq++ // the session's, named by its will
		sess = &session{will: sp.death(dv.d.ID), sub: sp.topic("NCMD", dv.d.ID), onMsg: func(p []byte) {
			if isRebirth(p) {
				select {
				case sp.rebirth <- struct{}{}:
				default:
				}
			}
		}}
	}
	c, err := dialDevice(ctx, dv.f.Addr, dv.d, sess)
	if err != nil {
		dv.f.report(dv.d.ID, err)
		return
	}
	dv.c = c
	dv.f.connects.Add(1)
	if dv.sp != nil {
		dv.sp.queueBirths() // before anything else
		dv.sp.born = false
	}
}

func (dv *device) drop() {
	if dv.sp != nil && dv.c != nil {
		// Going offline on purpose, a Sparkplug edge node says so first.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = dv.c.publish(ctx, dv.sp.death(dv.d.ID).Topic, 0, dv.sp.death(dv.d.ID).Payload)
		cancel()
	}
	if dv.c != nil {
		dv.c.close()
		dv.c = nil
	}
}

// toggle goes offline or comes back.
func (dv *device) toggle(ctx context.Context, t *time.Timer) {
	if dv.online {
		dv.online = false
		dv.drop()
		// What was waiting to go out is now buffered too, in order.
		dv.backlog = append(dv.backlog, dv.live...)
		dv.live = nil
		t.Reset(dv.d.OfflineFor)
		return
	}
	dv.online = true
	dv.connect(ctx)
	t.Reset(dv.d.OfflineEvery - dv.d.OfflineFor)
}

// sample takes a reading of every metric and queues its publications.
func (dv *device) sample() {
	d := dv.d
	if dv.sp != nil && d.AliasLossProb > 0 && dv.rng.Float64() < d.AliasLossProb && dv.sp.born {
		dv.sp.loseAliases()
	}
	at := dv.now()
	msgs, sent := Encode(d, dv.clock(at), dv.rng)
	var out []outMsg
	for i, m := range msgs {
		om := outMsg{Message: m}
		for _, s := range sent {
			if s.msg == i {
				s.Sent.Kind = KindReading
				s.Sent.Topic = m.Topic
				s.Sent.Bare = d.Form == FormBare
				s.Sent.Form = d.Form.String()
				om.sent = append(om.sent, s.Sent)
			}
		}
		if d.MalformedProb > 0 && dv.rng.Float64() < d.MalformedProb {
			om.Payload = []byte(malformed[dv.rng.IntN(len(malformed))])
			om.sent = []Sent{{Device: d.ID, QoS: d.QoS, Kind: KindMalformed, Topic: m.Topic, Form: d.Form.String()}}
		}
		out = append(out, om)
		if d.DuplicateProb > 0 && dv.rng.Float64() < d.DuplicateProb {
			dup := outMsg{Message: om.Message}
			for _, s := range om.sent {
				if s.Kind == KindReading {
					s.Kind = KindDuplicate
				}
				dup.sent = append(dup.sent, s)
			}
			out = append(out, dup)
		}
	}
	dv.f.buffered.Add(uint64(len(out)))
	if d.ReorderWithin > 0 {
		// Held back from the moment of the sample: none is released more
		// than ReorderWithin after it was taken.
		for _, om := range out {
			om.due = at.Add(time.Duration(dv.rng.Int64N(int64(d.ReorderWithin) + 1)))
			i := sort.Search(len(dv.delayed), func(i int) bool { return dv.delayed[i].due.After(om.due) })
			dv.delayed = slices.Insert(dv.delayed, i, om)
		}
		return
	}
	dv.enqueue(out)
}

func (dv *device) enqueue(out []outMsg) {
	for i := range out {
		out[i].historical = !dv.online
	}
	if dv.online && len(dv.backlog) == 0 {
		dv.live = append(dv.live, out...)
	} else if dv.online && dv.d.Interleave {
		dv.live = append(dv.live, out...)
	} else {
		dv.backlog = append(dv.backlog, out...)
	}
}

// release moves the held-back publications that are due to the queues
// (the loop sets the timer for the next).
func (dv *device) release() {
	now := dv.now()
	n := 0
	for n < len(dv.delayed) && !dv.delayed[n].due.After(now) {
		n++
	}
	dv.enqueue(dv.delayed[:n:n])
	dv.delayed = dv.delayed[n:]
}

// sendOne sends the next publication: live ones first when interleaving a
// replay, else in order. When the connection fails it is dropped; the
// publication stays at the head of its queue and is sent again.
func (dv *device) sendOne(ctx context.Context) {
	if dv.sp != nil && len(dv.sp.births) > 0 {
		dv.sendBirth(ctx)
		return
	}
	q := &dv.backlog
	if len(dv.live) > 0 && (len(dv.backlog) == 0 || dv.d.Interleave) {
		q = &dv.live
	}
	om := (*q)[0]
	d, f := dv.d, dv.f
	if dv.sp != nil && om.sent[0].Kind != KindMalformed {
		dv.sp.encodeData(&om, d.Metrics)
	}
	// A publication that has begun is finished even if ctx ends meanwhile,
	// as firmware would: the truth log then matches the wire exactly.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	t0 := time.Now()
	err := dv.c.publish(pctx, om.Topic, d.QoS, om.Payload)
	cancel()
	at := dv.now()
	began := at.Add(-time.Since(t0))
	if err == nil && d.QoS > 0 {
		f.recordAck(time.Since(t0))
	}
	for i := range om.sent {
		s := &om.sent[i]
		s.SendStart, s.SentAt = began, at
		s.Acked = err == nil && d.QoS > 0
		s.Err = ""
		if err != nil {
			s.Err = err.Error()
		}
		if s.Kind != KindMalformed {
			f.sent.Add(1)
			if s.Acked {
				f.acked.Add(1)
			}
		}
	}
	if f.Truth != nil {
		f.Truth.add(om.sent)
	}
	if err != nil {
		f.report(d.ID, err)
		dv.drop()
		return
	}
	*q = (*q)[1:]
	f.buffered.Add(^uint64(0)) // minus one
}

// sendBirth sends the next of a Sparkplug edge node's births; on failure
// the connection is dropped and the births are sent again on the next.
func (dv *device) sendBirth(ctx context.Context) {
	sp := dv.sp
	om := sp.births[0]
	sp.encodeBirth(&om, dv.d.ID, dv.d.Metrics, dv.now())
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := dv.c.publish(pctx, om.Topic, dv.d.QoS, om.Payload)
	cancel()
	if err != nil {
		dv.f.report(dv.d.ID, err)
		dv.drop()
		return
	}
	sp.births = sp.births[1:]
}

// malformed payloads, each refused by the gateway's decoder.
var malformed = []string{`{"v":`, `not a number`, `{"v":"warm"}`, "\xff\xfe\x00", `[{"n":"x"}]`, `{"v":1e999}`}

func (f *Fleet) runSubscriber(ctx context.Context, s Subscriber) {
	for ctx.Err() == nil {
		c, lost, err := dialSubscriber(ctx, f.Addr, s, func() { f.received.Add(1) })
		if err != nil {
			f.report(s.ID, err)
			sleepCtx(ctx, time.Second)
			continue
		}
		f.connects.Add(1)
		select {
		case <-ctx.Done():
			c.Disconnect(&paho.Disconnect{})
			return
		case <-lost:
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// receiveMaximum is what simulated clients announce. paho.golang sizes a
// channel by it for each client; left unset that is 65,535 slots, 512 KiB
// per client, which made a thousand devices take 300 MiB.
const receiveMaximum = 64

// connectPacket is a device's MQTT 5 CONNECT with a clean start.
func connectPacket(id string) *paho.Connect {
	rm := uint16(receiveMaximum)
	return &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true, Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}}
}

// Dial connects an MQTT 5 client with a clean session.
func Dial(ctx context.Context, addr, id, user, pass string) (*paho.Client, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	cp := connectPacket(id)
	if user != "" {
		cp.Username, cp.UsernameFlag = user, true
		cp.Password, cp.PasswordFlag = []byte(pass), true
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ca, err := c.Connect(cctx, cp)
	if err != nil {
		conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("connect %s as %s: reason %d: %w", addr, id, ca.ReasonCode, err)
		}
		return nil, fmt.Errorf("connect %s as %s: %w", addr, id, err)
	}
	return c, nil
}

// Message is one MQTT publication.
type Message struct {
	Topic   string
	Payload []byte
}

type sentIn struct {
	Sent
	msg int // index of the message that carries it
}

// Encode samples every metric of d at t and encodes the readings in d's
// form: one message per metric for the bare and v+t forms, one per device
// otherwise.
func Encode(d Device, t time.Time, rng *rand.Rand) ([]Message, []sentIn) {
	prefix := d.Prefix
	if prefix == "" {
		prefix = "sensors"
	}
	t = t.Truncate(time.Millisecond)
	var msgs []Message
	var sent []sentIn
	vals := make([]float64, len(d.Metrics))
	for i, m := range d.Metrics {
		vals[i] = m.Signal.At(t, rng)
	}
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	switch d.Form {
	case FormBare, FormVT:
		for i, m := range d.Metrics {
			body := num(vals[i])
			unit := ""
			if d.Form == FormVT {
				unit = m.Unit
				u := ""
				if unit != "" {
					u = fmt.Sprintf(`,"u":%q`, unit)
				}
				body = fmt.Sprintf(`{"v":%s,"t":%q%s}`, body, t.UTC().Format(time.RFC3339Nano), u)
			}
			msgs = append(msgs, Message{Topic: prefix + "/" + d.ID + "/" + m.Name, Payload: []byte(body)})
			sent = append(sent, sentIn{Sent{Device: d.ID, Metric: m.Name, Unit: unit, Time: t, Value: vals[i], QoS: d.QoS}, i})
		}
	case FormObject:
		b := []byte(`{"t":` + strconv.FormatInt(t.UnixMilli(), 10))
		for i, m := range d.Metrics {
			b = append(b, `,"`+m.Name+`":`+num(vals[i])...)
			sent = append(sent, sentIn{Sent{Device: d.ID, Metric: m.Name, Time: t, Value: vals[i], QoS: d.QoS}, 0})
		}
		msgs = append(msgs, Message{Topic: prefix + "/" + d.ID, Payload: append(b, '}')})
	case FormSparkplug:
		// One DDATA of every metric; encoded when it is sent (by alias,
		// with the seq of the moment).
		sp := newSpState(d)
		msgs = append(msgs, Message{Topic: sp.topic("DDATA", d.ID)})
		for i, m := range d.Metrics {
			sent = append(sent, sentIn{Sent{Device: sp.deviceName(d.ID), Metric: m.Name, Time: t, Value: vals[i], QoS: d.QoS}, 0})
		}
	case FormSenML:
		b := []byte(`[`)
		for i, m := range d.Metrics {
			if i == 0 {
				b = append(b, fmt.Sprintf(`{"bn":%q,"bt":%s,`, d.ID+":", num(float64(t.UnixMilli())/1e3))...)
			} else {
				b = append(b, ",{"...)
			}
			b = append(b, fmt.Sprintf(`"n":%q,`, m.Name)...)
			if m.Unit != "" {
				b = append(b, fmt.Sprintf(`"u":%q,`, m.Unit)...)
			}
			b = append(b, `"v":`+num(vals[i])+`}`...)
			sent = append(sent, sentIn{Sent{Device: d.ID, Metric: m.Name, Unit: m.Unit, Time: t, Value: vals[i], QoS: d.QoS}, 0})
		}
		msgs = append(msgs, Message{Topic: prefix + "/" + d.ID, Payload: append(b, ']')})
	}
	return msgs, sent
}

// Environmental returns the metrics of a typical indoor environment
// sensor: temperature, humidity and pressure.
func Environmental() []Metric {
	return []Metric{
		{Name: "temp_c", Unit: "Cel", Signal: Signal{Base: 21, Drift: 0.1, Amplitude: 1.5, Period: 10 * time.Minute, Noise: 0.05, Resolution: 0.01}},
		{Name: "rh", Unit: "%RH", Signal: Signal{Base: 45, Amplitude: 5, Period: 17 * time.Minute, Noise: 0.3, Resolution: 0.1}},
		{Name: "pressure", Unit: "Pa", Signal: Signal{Base: 101325, Amplitude: 80, Period: time.Hour, Noise: 2, Resolution: 1}},
	}
}

// NewFleet returns n devices named prefix-001... cycling through the four
// payload forms, each sampling the environmental metrics every interval.
func NewFleet(addr string, n int, prefix string, interval time.Duration, qos byte) *Fleet {
	f := &Fleet{Addr: addr, Truth: &Truth{}}
	for i := 0; i < n; i++ {
		f.Devices = append(f.Devices, Device{
			ID:       fmt.Sprintf("%s-%03d", prefix, i+1),
			Metrics:  Environmental(),
			Interval: interval,
			QoS:      qos,
			Form:     Form(i % 4),
		})
	}
	return f
}
