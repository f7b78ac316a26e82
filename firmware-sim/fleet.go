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
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
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
}

// At returns the signal's value at t, with noise drawn from rng.
func (s Signal) At(t time.Time, rng *rand.Rand) float64 {
	secs := float64(t.UnixNano()) / 1e9
	v := s.Base + s.Drift*math.Mod(secs, 86400)/3600
	if s.Period > 0 {
		v += s.Amplitude * math.Sin(2*math.Pi*secs/s.Period.Seconds())
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
}

// Sent is one reading a device tried to send.
type Sent struct {
	Device string
	Metric string
	Unit   string
	Time   time.Time // event time as encoded in the payload (arrival time is unknown for the bare form)
	Value  float64
	QoS    byte
	Acked  bool // QoS > 0 and acknowledged with success
	Err    string
}

// Truth records what the fleet sent. It is safe for concurrent use.
type Truth struct {
	mu   sync.Mutex
	sent []Sent
}

func (t *Truth) add(s []Sent) {
	t.mu.Lock()
	t.sent = append(t.sent, s...)
	t.mu.Unlock()
}

// Sent returns a copy of the records so far.
func (t *Truth) Sent() []Sent {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Sent(nil), t.sent...)
}

// Fleet runs devices against one broker address.
type Fleet struct {
	Addr    string
	Devices []Device
	Truth   *Truth           // optional
	Now     func() time.Time // default time.Now
	Seed    uint64
	// OnError, if set, receives connection and publish errors; the device
	// reconnects after a pause.
	OnError func(device string, err error)

	sent, acked, errs, connects atomic.Uint64
	ackLatency                  [latencyBuckets + 1]atomic.Uint64 // 100 µs buckets; the last is ≥ 100 ms
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
}

// Stats returns the fleet's counters; safe to call while it runs.
func (f *Fleet) Stats() FleetStats {
	return FleetStats{Sent: f.sent.Load(), Acked: f.acked.Load(), Errors: f.errs.Load(), Connects: f.connects.Load()}
}

// Run runs every device until ctx is cancelled, then disconnects them.
func (f *Fleet) Run(ctx context.Context) error {
	now := f.Now
	if now == nil {
		now = time.Now
	}
	var wg sync.WaitGroup
	for i, d := range f.Devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(f.Seed, uint64(i)))
			f.runDevice(ctx, d, rng, now)
		}()
	}
	wg.Wait()
	return nil
}

func (f *Fleet) report(dev string, err error) {
	f.errs.Add(1)
	if f.OnError != nil && err != nil {
		f.OnError(dev, err)
	}
}

func (f *Fleet) runDevice(ctx context.Context, d Device, rng *rand.Rand, now func() time.Time) {
	// Connect at once, as a device does when it boots, then sample at a
	// random phase so a fleet does not publish in lockstep.
	var c *paho.Client
	defer func() {
		if c != nil {
			c.Disconnect(&paho.Disconnect{})
		}
	}()
	if cc, err := Dial(ctx, f.Addr, d.ID, d.Username, d.Password); err != nil {
		f.report(d.ID, err)
	} else {
		c = cc
		f.connects.Add(1)
	}
	timer := time.NewTimer(time.Duration(rng.Int64N(int64(d.Interval) + 1)))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(d.Interval)
		if c == nil {
			var err error
			if c, err = Dial(ctx, f.Addr, d.ID, d.Username, d.Password); err != nil {
				f.report(d.ID, err)
				c = nil
				continue
			}
			f.connects.Add(1)
		}
		t := now()
		msgs, sent := Encode(d, t, rng)
		// A sample that has begun is finished even if ctx ends meanwhile, as
		// firmware would: the truth log then matches the wire exactly.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		for i, m := range msgs {
			t0 := time.Now()
			_, err := c.Publish(pctx, &paho.Publish{Topic: m.Topic, QoS: d.QoS, Payload: m.Payload})
			if err == nil && d.QoS > 0 {
				f.recordAck(time.Since(t0))
			}
			for j := range sent {
				if sent[j].msg == i {
					f.sent.Add(1)
					if err == nil && d.QoS > 0 {
						f.acked.Add(1)
					}
					sent[j].Acked = err == nil && d.QoS > 0
					if err != nil {
						sent[j].Err = err.Error()
					}
				}
			}
			if err != nil {
				f.report(d.ID, err)
				c.Disconnect(&paho.Disconnect{})
				c = nil
				break
			}
		}
		cancel()
		if f.Truth != nil {
			out := make([]Sent, len(sent))
			for i, s := range sent {
				out[i] = s.Sent
			}
			f.Truth.add(out)
		}
	}
}

// Dial connects an MQTT 5 client with a clean session.
func Dial(ctx context.Context, addr, id, user, pass string) (*paho.Client, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	cp := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}
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
