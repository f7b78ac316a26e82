package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	"periph.io/x/conn/v3/physic"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/devices/bh1750"
	"github.com/edgegate/edgegate/devices/bme280"
	"github.com/edgegate/edgegate/devices/sht3x"
)

// The gateway's own I²C sensors (config sensors:). Each has a goroutine,
// owned by Run, that opens its bus by name through periph's registry
// (i2creg: the host's buses after host.Init, or an emulated bus the
// program registered), polls the sensor every interval, and journals each
// value as a publication of the configured device on the sensor topic, so
// readings take the same path as MQTT ones; they are also published on the
// local broker for local subscribers. A missing or failing sensor is
// logged, counted and retried with capped backoff; it never stops the
// gateway.

// SensorStatus is one sensor's state, for /api/status.
type SensorStatus struct {
	Sensor    string // driver@bus:address
	Device    string
	Up        bool   // the last poll succeeded
	Polls     uint64 // successful polls
	Errors    uint64 // failed opens and polls
	LastError string `json:",omitempty"`
}

type sensorState struct {
	cfg    configs.Sensor
	name   string
	up     atomic.Bool
	polls  atomic.Uint64
	errors atomic.Uint64
	mu     sync.Mutex
	last   string
}

// sensorValue is one metric of a poll.
type sensorValue struct {
	metric, unit string
	v            float64
}

// sensorReader is an opened sensor.
type sensorReader interface {
	read() ([]sensorValue, error)
	halt() error
}

func newSensorStates(cfg *configs.Config) []*sensorState {
	var out []*sensorState
	for _, s := range cfg.Sensors {
		out = append(out, &sensorState{cfg: s, name: fmt.Sprintf("%s@%s:%#02x", s.Driver, s.Bus, s.Address)})
	}
	return out
}

// openSensor opens the sensor's bus and driver.
func openSensor(s configs.Sensor) (sensorReader, i2c.BusCloser, error) {
	bus, err := i2creg.Open(s.Bus)
	if err != nil {
		return nil, nil, fmt.Errorf("open i2c bus %q: %w", s.Bus, err)
	}
	addr := uint16(s.Address)
	var r sensorReader
	switch s.Driver {
	case "bme280":
		var d *bme280.Dev
		if d, err = bme280.NewI2C(bus, addr, &bme280.Opts{Temperature: bme280.O2x, Pressure: bme280.O4x, Humidity: bme280.O1x}); err == nil {
			r = bmeReader{d}
		}
	case "sht3x":
		var d *sht3x.Dev
		if d, err = sht3x.NewI2C(bus, addr, nil); err == nil {
			r = shtReader{d}
		}
	case "bh1750":
		var d *bh1750.Dev
		if d, err = bh1750.NewI2C(bus, addr, nil); err == nil {
			r = bhReader{d}
		}
	default:
		err = fmt.Errorf("unknown driver %q", s.Driver)
	}
	if err != nil {
		bus.Close()
		return nil, nil, err
	}
	return r, bus, nil
}

func celsius(t physic.Temperature) float64 {
	return float64(t-physic.ZeroCelsius) / float64(physic.Celsius)
}

type bmeReader struct{ d *bme280.Dev }

func (r bmeReader) read() ([]sensorValue, error) {
	var e physic.Env
	if err := r.d.Sense(&e); err != nil {
		return nil, err
	}
	v := []sensorValue{{"temperature", "Cel", celsius(e.Temperature)}, {"pressure", "Pa", float64(e.Pressure) / float64(physic.Pascal)}}
	if r.d.Humidity() {
		v = append(v, sensorValue{"humidity", "%RH", float64(e.Humidity) / float64(physic.PercentRH)})
	}
	return v, nil
}

func (r bmeReader) halt() error { return r.d.Halt() }

type shtReader struct{ d *sht3x.Dev }

func (r shtReader) read() ([]sensorValue, error) {
	var e physic.Env
	if err := r.d.Sense(&e); err != nil {
		return nil, err
	}
	return []sensorValue{{"temperature", "Cel", celsius(e.Temperature)}, {"humidity", "%RH", float64(e.Humidity) / float64(physic.PercentRH)}}, nil
}

func (r shtReader) halt() error { return r.d.Halt() }

type bhReader struct{ d *bh1750.Dev }

func (r bhReader) read() ([]sensorValue, error) {
	lux, err := r.d.Sense()
	if err != nil {
		return nil, err
	}
	return []sensorValue{{"illuminance", "lx", float64(lux) / float64(bh1750.Lux)}}, nil
}

func (r bhReader) halt() error { return r.d.Halt() }

// runSensor polls one sensor until ctx ends.
func (g *Gateway) runSensor(ctx context.Context, st *sensorState) {
	const minBackoff, maxBackoff = time.Second, time.Minute
	backoff := minBackoff
	fail := func(err error) {
		st.up.Store(false)
		st.errors.Add(1)
		st.mu.Lock()
		st.last = err.Error()
		st.mu.Unlock()
		if ok, held := g.logLimiter.allow("sensor "+st.name, g.now()); ok {
			g.log.Warn("sensor failed; retrying", "sensor", st.name, "device", st.cfg.Device, "err", err, "retry_in", backoff, "suppressed_since_last", held)
		}
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		r, bus, err := openSensor(st.cfg)
		if err != nil {
			fail(err)
			if !wait(backoff/2 + rand.N(backoff/2+1)) {
				return
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		g.log.Info("sensor ready", "sensor", st.name, "device", st.cfg.Device, "interval", st.cfg.Every.D().String())
		tick := time.NewTicker(st.cfg.Every.D())
		for {
			vals, err := r.read()
			if err != nil {
				fail(err)
				break
			}
			backoff = minBackoff
			st.up.Store(true)
			st.polls.Add(1)
			g.sensorReadings(st.cfg, vals)
			select {
			case <-ctx.Done():
			case <-tick.C:
				continue
			}
			break
		}
		tick.Stop()
		r.halt()
		bus.Close()
		if ctx.Err() == nil && !wait(backoff/2+rand.N(backoff/2+1)) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// sensorReadings journals a poll's values as publications of the sensor's
// device, and publishes them on the local broker.
func (g *Gateway) sensorReadings(s configs.Sensor, vals []sensorValue) {
	at := g.now().UnixMilli()
	for _, v := range vals {
		name := v.metric
		if n, ok := s.Metrics[v.metric]; ok {
			name = n
		}
		topic, _ := g.cfg.SensorTopic(s.Device, name) // validated: a pattern exists
		body := strconv.AppendFloat([]byte(`{"v":`), v.v, 'f', -1, 64)
		body = append(body, `,"t":`...)
		body = strconv.AppendInt(body, at, 10)
		body = append(body, `,"u":"`...)
		body = append(body, v.unit...)
		body = append(body, `"}`...)
		if err := g.j.local("sensor:"+s.Device, topic, body); err != nil {
			return // the journal failed; Run reports it
		}
		g.server.Publish(topic, body, false, 0) // local subscribers; the hook does not take inline publications
	}
}

// Sensors returns the state of each configured sensor.
func (g *Gateway) sensorStatus() []SensorStatus {
	var out []SensorStatus
	for _, st := range g.sensors {
		st.mu.Lock()
		last := st.last
		st.mu.Unlock()
		out = append(out, SensorStatus{Sensor: st.name, Device: st.cfg.Device, Up: st.up.Load(), Polls: st.polls.Load(),
			Errors: st.errors.Load(), LastError: last})
	}
	return out
}
