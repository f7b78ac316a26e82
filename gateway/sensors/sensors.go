// Package sensors polls the gateway's own I²C sensors (configuration key
// sensors:). A Poller runs one goroutine per sensor: it opens the sensor's
// bus with the opener it is given (periph's registry in production, an
// emulated bus in tests), opens the chip through the devices table, reads
// it every interval and hands each value, as a publication of the sensor's
// device, to the publish function it is given; the gateway journals it and
// publishes it on the local broker, so that readings take the same path as
// MQTT ones. A missing or failing sensor is logged (at most once per 10 s
// per sensor), counted in Status and retried with capped, jittered
// backoff; it never stops the other sensors or the caller.
//
// The package knows neither the configuration file nor the gateway: the
// caller maps its configuration to Options.
package sensors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"periph.io/x/conn/v3/i2c"

	"github.com/edgegate/edgegate/devices"
	"github.com/edgegate/edgegate/gateway/internal/lograte"
)

// Sensor is one chip to poll.
type Sensor struct {
	Driver  string // a devices.Drivers name: bme280, sht3x, bh1750
	Bus     string // the bus name given to Options.OpenBus
	Address uint16 // 7-bit
	// Device is the device id its readings are published as; the client
	// id of its publications is "sensor:" + Device.
	Device string
	Every  time.Duration // the poll interval, > 0
	// Rename maps a driver metric (e.g. temperature) to the metric name of
	// the readings; metrics not in it keep the driver's name.
	Rename map[string]string
}

// Options configures a Poller. OpenBus, Topic and Publish are required.
type Options struct {
	Sensors []Sensor
	// OpenBus opens a bus by name, e.g. periph's i2creg.Open. Each sensor
	// opens its bus itself and closes it before reopening after a
	// failure.
	OpenBus func(name string) (i2c.BusCloser, error)
	// Topic returns the MQTT topic for a device's metric.
	Topic func(device, metric string) string
	// Publish takes one reading: payload {"v":<value>,"t":<unix ms>,"u":"<unit>"}
	// on topic, from client "sensor:<device>". It is called from the
	// sensors' goroutines, concurrently, and should not block for long;
	// the payload is the callee's to keep. An error drops the poll's
	// remaining values (the caller reports its own failure); the sensor
	// keeps polling.
	Publish func(client, topic string, payload []byte) error
	Now     func() time.Time // the readings' clock; nil means time.Now
	Log     *slog.Logger     // nil discards
}

// Status is one sensor's state, for the gateway's status report.
type Status struct {
	Sensor    string // driver@bus:address
	Device    string
	Up        bool   // the last poll succeeded
	Polls     uint64 // successful polls
	Errors    uint64 // failed opens and polls
	LastError string `json:",omitempty"`
}

// Poller polls a fixed set of sensors. Create it with New, start it with
// Run; Status may be called at any time, from any goroutine.
type Poller struct {
	opt     Options
	sensors []*state
}

// Backoff between attempts after a failure: from minBackoff, doubling up
// to maxBackoff, reset by a successful poll.
const (
	minBackoff = time.Second
	maxBackoff = time.Minute
	// logEvery is how often a failing sensor may log.
	logEvery = 10 * time.Second
)

// state is one sensor's configuration and counters. The counters are
// written by its goroutine and read by Status.
type state struct {
	Sensor
	driver devices.Driver
	name   string
	up     atomic.Bool
	polls  atomic.Uint64
	errors atomic.Uint64
	mu     sync.Mutex
	last   string
	logs   lograte.Limiter
}

// New checks o and returns a Poller for its sensors; nothing runs until
// Run. It fails on a missing function, an unknown driver or an interval
// that is not positive.
func New(o Options) (*Poller, error) {
	if o.OpenBus == nil || o.Topic == nil || o.Publish == nil {
		return nil, errors.New("sensors: OpenBus, Topic and Publish are required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	p := &Poller{opt: o}
	for _, s := range o.Sensors {
		name := fmt.Sprintf("%s@%s:%#02x", s.Driver, s.Bus, s.Address)
		d, ok := devices.Lookup(s.Driver)
		if !ok {
			return nil, fmt.Errorf("sensor %s: unknown driver %q", name, s.Driver)
		}
		if s.Every <= 0 {
			return nil, fmt.Errorf("sensor %s: interval %s is not positive", name, s.Every)
		}
		p.sensors = append(p.sensors, &state{Sensor: s, driver: d, name: name, logs: lograte.Limiter{Every: logEvery}})
	}
	return p, nil
}

// Run polls every sensor, each in its own goroutine, until ctx is
// cancelled, and returns once all of them have stopped (each halts its
// chip and closes its bus first). Call it once.
func (p *Poller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, st := range p.sensors {
		wg.Go(func() { p.run(ctx, st) })
	}
	wg.Wait()
}

// Status returns each sensor's state, in the order of Options.Sensors.
func (p *Poller) Status() []Status {
	var out []Status
	for _, st := range p.sensors {
		st.mu.Lock()
		last := st.last
		st.mu.Unlock()
		out = append(out, Status{Sensor: st.name, Device: st.Device, Up: st.up.Load(), Polls: st.polls.Load(),
			Errors: st.errors.Load(), LastError: last})
	}
	return out
}

// run polls one sensor until ctx ends: open, read every interval until a
// read fails, halt and close, wait out the backoff, and again.
func (p *Poller) run(ctx context.Context, st *state) {
	b := backoff{d: minBackoff, min: minBackoff, max: maxBackoff}
	fail := func(err error) {
		st.up.Store(false)
		st.errors.Add(1)
		st.mu.Lock()
		st.last = err.Error()
		st.mu.Unlock()
		if ok, held := st.logs.Allow("sensor", p.opt.Now()); ok {
			p.opt.Log.Warn("sensor failed; retrying", "sensor", st.name, "device", st.Device, "err", err, "retry_in", b.d, "suppressed_since_last", held)
		}
	}
	for ctx.Err() == nil {
		bus, sensor, err := p.open(st)
		if err != nil {
			fail(err)
			if !sleep(ctx, b.next()) {
				return
			}
			continue
		}
		p.opt.Log.Info("sensor ready", "sensor", st.name, "device", st.Device, "interval", st.Every.String())
		tick := time.NewTicker(st.Every)
		for {
			vals, err := sensor.Read()
			if err != nil {
				fail(err)
				break
			}
			b.reset()
			st.up.Store(true)
			st.polls.Add(1)
			p.publish(st, vals)
			if !sleepTick(ctx, tick) {
				break
			}
		}
		tick.Stop()
		sensor.Halt()
		bus.Close()
		if ctx.Err() == nil && !sleep(ctx, b.next()) {
			return
		}
	}
}

// open opens the sensor's bus and its chip.
func (p *Poller) open(st *state) (i2c.BusCloser, devices.Sensor, error) {
	bus, err := p.opt.OpenBus(st.Bus)
	if err != nil {
		return nil, nil, fmt.Errorf("open i2c bus %q: %w", st.Bus, err)
	}
	sensor, err := st.driver.Open(bus, st.Address)
	if err != nil {
		bus.Close()
		return nil, nil, err
	}
	return bus, sensor, nil
}

// publish hands a poll's values to Options.Publish, one reading each,
// stamped with the time of the poll.
func (p *Poller) publish(st *state, vals []devices.Value) {
	at := p.opt.Now().UnixMilli()
	for _, v := range vals {
		name := v.Metric
		if n, ok := st.Rename[v.Metric]; ok {
			name = n
		}
		if err := p.opt.Publish("sensor:"+st.Device, p.opt.Topic(st.Device, name), payload(v.V, at, v.Unit)); err != nil {
			return // the caller's sink failed, and reports it
		}
	}
}

// payload is the body of one reading: {"v":<v>,"t":<unix ms>,"u":"<unit>"},
// the value in the shortest decimal form that reads back exactly.
func payload(v float64, unixMilli int64, unit string) []byte {
	body := strconv.AppendFloat([]byte(`{"v":`), v, 'f', -1, 64)
	body = append(body, `,"t":`...)
	body = strconv.AppendInt(body, unixMilli, 10)
	body = append(body, `,"u":"`...)
	body = append(body, unit...)
	return append(body, `"}`...)
}

// backoff is a capped exponential delay with jitter: each wait is drawn
// from [d/2, d], so that sensors failing together do not retry in step,
// and d doubles after each wait up to max.
type backoff struct{ d, min, max time.Duration }

// next returns the wait before the next attempt and doubles d.
func (b *backoff) next() time.Duration {
	w := b.d/2 + rand.N(b.d/2+1)
	b.d = min(2*b.d, b.max)
	return w
}

// reset starts the delays again from min.
func (b *backoff) reset() { b.d = b.min }

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sleepTick waits for the ticker's next tick, and reports false if ctx
// ended first.
func sleepTick(ctx context.Context, t *time.Ticker) bool {
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
