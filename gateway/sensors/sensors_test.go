package sensors_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"periph.io/x/conn/v3/i2c"

	"github.com/edgegate/edgegate/firmware-sim/chips"
	"github.com/edgegate/edgegate/gateway/sensors"
)

// TestMain fails the package if a poller leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// reading is one call of Options.Publish.
type reading struct{ client, topic, payload string }

// rig is a poller's surroundings: one emulated bus, counted opens and
// closes, the readings published, and the log.
type rig struct {
	opens, closes  atomic.Int64
	mu             sync.Mutex
	readings       []reading
	publishErr     error
	log            bytes.Buffer // written under mu, by a locked handler
	cancel         context.CancelFunc
	done           chan struct{}
	poller         *sensors.Poller
	publishedCalls atomic.Int64
}

type countedBus struct {
	*chips.Bus
	closes *atomic.Int64
}

func (b countedBus) Close() error { b.closes.Add(1); return b.Bus.Close() }

type lockedWriter struct{ r *rig }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.log.Write(p)
}

// start runs a poller over bus for ss, until stop.
func start(t *testing.T, bus *chips.Bus, ss ...sensors.Sensor) *rig {
	t.Helper()
	r := &rig{done: make(chan struct{})}
	p, err := sensors.New(sensors.Options{
		Sensors: ss,
		OpenBus: func(name string) (i2c.BusCloser, error) {
			if name != bus.String() {
				return nil, fmt.Errorf("bus %q not found", name)
			}
			r.opens.Add(1)
			return countedBus{bus, &r.closes}, nil
		},
		Topic: func(device, metric string) string { return "sensors/" + device + "/" + metric },
		Publish: func(client, topic string, payload []byte) error {
			r.publishedCalls.Add(1)
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.publishErr != nil {
				return r.publishErr
			}
			r.readings = append(r.readings, reading{client, topic, string(payload)})
			return nil
		},
		Log: slog.New(slog.NewTextHandler(lockedWriter{r}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.poller = p
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		p.Run(ctx)
	}()
	return r
}

// stop cancels the poller and waits for Run to return; every bus opened
// must be closed by then.
func (r *rig) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	<-r.done
	if o, c := r.opens.Load(), r.closes.Load(); o != c {
		t.Errorf("%d bus opens, %d closes", o, c)
	}
}

func (r *rig) logText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// TestPoll polls the three chips of the emulated bus every second for
// 2.5 s: three polls each, each value a reading of the sensor's device on
// its metric's topic (renamed where asked), stamped with the poll's time.
func TestPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus, err := chips.EmulatedBus("emulated",
			chips.EmulatedChip{Driver: "bme280", Address: 0x76},
			chips.EmulatedChip{Driver: "sht3x", Address: 0x44},
			chips.EmulatedChip{Driver: "bh1750", Address: 0x23})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		r := start(t, bus,
			sensors.Sensor{Driver: "bme280", Bus: "emulated", Address: 0x76, Device: "board", Every: time.Second, Rename: map[string]string{"temperature": "temp_c"}},
			sensors.Sensor{Driver: "sht3x", Bus: "emulated", Address: 0x44, Device: "board-sht", Every: time.Second},
			sensors.Sensor{Driver: "bh1750", Bus: "emulated", Address: 0x23, Device: "board", Every: time.Second})
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		status := r.poller.Status()
		r.stop(t)

		for i, name := range []string{"bme280@emulated:0x76", "sht3x@emulated:0x44", "bh1750@emulated:0x23"} {
			if s := status[i]; s.Sensor != name || !s.Up || s.Polls != 3 || s.Errors != 0 || s.LastError != "" {
				t.Errorf("status %d: %+v, want %s up after 3 polls", i, s, name)
			}
		}
		// The BH1750 sees 320 lx exactly, measured 180 ms after each
		// tick (its measurement time).
		var lux []string
		want := map[string]struct {
			client, unit string
			v, within    float64
		}{
			"sensors/board/temp_c":          {"sensor:board", "Cel", 21, 0.2},
			"sensors/board/pressure":        {"sensor:board", "Pa", 101475, 1},
			"sensors/board/humidity":        {"sensor:board", "%RH", 45, 0.2},
			"sensors/board-sht/temperature": {"sensor:board-sht", "Cel", 20.5, 0.01},
			"sensors/board-sht/humidity":    {"sensor:board-sht", "%RH", 48, 0.01},
			"sensors/board/illuminance":     {"sensor:board", "lx", 320, 0},
		}
		count := map[string]int{}
		for _, rd := range r.readings {
			if rd.topic == "sensors/board/illuminance" {
				lux = append(lux, rd.payload)
			}
			w, ok := want[rd.topic]
			if !ok || rd.client != w.client {
				t.Errorf("unexpected reading %+v", rd)
				continue
			}
			count[rd.topic]++
			var p struct {
				V float64
				T int64
				U string
			}
			if err := json.Unmarshal([]byte(rd.payload), &p); err != nil {
				t.Fatalf("%s: %v", rd.payload, err)
			}
			// The BME280's values drift slowly from where the script
			// starts; the others hold still.
			if p.U != w.unit || math.Abs(p.V-w.v) > w.within || p.T < t0.UnixMilli() || p.T > t0.Add(3*time.Second).UnixMilli() {
				t.Errorf("%s: %s, want about %g %s", rd.topic, rd.payload, w.v, w.unit)
			}
		}
		for topic := range want {
			if count[topic] != 3 {
				t.Errorf("%s: %d readings, want 3", topic, count[topic])
			}
		}
		var wantLux []string
		for i := range 3 {
			wantLux = append(wantLux, fmt.Sprintf(`{"v":320,"t":%d,"u":"lx"}`, t0.Add(time.Duration(i)*time.Second+180*time.Millisecond).UnixMilli()))
		}
		if strings.Join(lux, " ") != strings.Join(wantLux, " ") {
			t.Errorf("illuminance payloads\n%s\nwant\n%s", strings.Join(lux, "\n"), strings.Join(wantLux, "\n"))
		}
		if n := strings.Count(r.logText(), `msg="sensor ready"`); n != 3 {
			t.Errorf("%d ready lines, want 3:\n%s", n, r.logText())
		}
	})
}

// TestFailingSensor: a sensor that is not there is retried with backoff
// (1 s, 2 s, 4 s, … each with jitter), reported in Status and logged once
// per 10 s; it comes up when the chip appears, and after a failed read
// it is retried within a second again (a poll resets the backoff).
func TestFailingSensor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus := chips.NewBus("i2c-test")
		r := start(t, bus,
			sensors.Sensor{Driver: "sht3x", Bus: "i2c-test", Address: 0x45, Device: "missing", Every: time.Second},
			sensors.Sensor{Driver: "sht3x", Bus: "no-such-bus", Address: 0x44, Device: "nobus", Every: time.Second})
		time.Sleep(9 * time.Second)
		synctest.Wait()
		st := r.poller.Status()
		// Attempts at 0, 0.5…1, 1.5…3, 3.5…7 and 7.5…15 s.
		if s := st[0]; s.Up || s.Errors < 4 || s.Errors > 5 || !strings.Contains(s.LastError, "sht3x at 0x45") {
			t.Errorf("missing chip: %+v, want 4 or 5 errors in 9 s", s)
		}
		if s := st[1]; s.Up || s.Errors < 4 || s.Errors > 5 || !strings.Contains(s.LastError, `open i2c bus "no-such-bus"`) {
			t.Errorf("missing bus: %+v", s)
		}
		if n := strings.Count(r.logText(), `msg="sensor failed; retrying" sensor=sht3x@i2c-test:0x45`); n != 1 {
			t.Errorf("%d failure lines in 9 s, want 1 (one per 10 s):\n%s", n, r.logText())
		}

		chip := chips.NewSHT3x()
		bus.Attach(0x45, chip)
		time.Sleep(35 * time.Second) // the longest wait from 16 s is 32 s
		synctest.Wait()
		s := r.poller.Status()[0]
		if !s.Up || s.Polls == 0 {
			t.Fatalf("after the chip appeared: %+v", s)
		}
		errs := s.Errors
		// The next transaction fails. If it is the read of a measurement
		// (the poller is between command and read at this virtual
		// moment), the driver reads again and nothing fails; then fail
		// the next one, which is half a tick later.
		for try := 0; try < 4 && s.Errors == errs; try++ {
			chip.FailNACK(1)
			time.Sleep(2500 * time.Millisecond)
			synctest.Wait()
			s = r.poller.Status()[0]
		}
		if !s.Up || s.Errors != errs+1 {
			t.Errorf("after a failed read: %+v, want up again with %d errors", s, errs+1)
		}
		lines := strings.Split(strings.TrimSpace(r.logText()), "\n")
		var last string
		for _, l := range lines {
			if strings.Contains(l, "sensor=sht3x@i2c-test:0x45") && strings.Contains(l, "sensor failed") {
				last = l
			}
		}
		if !strings.Contains(last, "retry_in=1s") || !strings.Contains(last, "device=missing") {
			t.Errorf("last failure line %q, want retry_in=1s", last)
		}
		r.stop(t)
	})
}

// TestPublishFails: when the publish function fails, the poll's remaining
// values are dropped and the sensor keeps polling.
func TestPublishFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus, err := chips.EmulatedBus("emulated", chips.EmulatedChip{Driver: "bme280", Address: 0x77})
		if err != nil {
			t.Fatal(err)
		}
		r := start(t, bus)
		r.stop(t) // no sensors: Run returns at once
		r = start(t, bus, sensors.Sensor{Driver: "bme280", Bus: "emulated", Address: 0x77, Device: "d", Every: time.Second})
		r.mu.Lock()
		r.publishErr = errors.New("journal closed")
		r.mu.Unlock()
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		s := r.poller.Status()[0]
		r.stop(t)
		if n := r.publishedCalls.Load(); n != 3 || !s.Up || s.Polls != 3 {
			t.Errorf("%d publish calls, status %+v; want 3 polls of one call each", n, s)
		}
	})
}

// TestNew refuses options the poller could not run with.
func TestNew(t *testing.T) {
	ok := sensors.Options{
		OpenBus: func(string) (i2c.BusCloser, error) { return nil, errors.New("none") },
		Topic:   func(d, m string) string { return d + "/" + m },
		Publish: func(string, string, []byte) error { return nil },
	}
	for name, tc := range map[string]struct {
		mod  func(*sensors.Options)
		want string
	}{
		"no publish": {func(o *sensors.Options) { o.Publish = nil }, "OpenBus, Topic and Publish are required"},
		"unknown driver": {func(o *sensors.Options) {
			o.Sensors = []sensors.Sensor{{Driver: "sht31", Bus: "1", Address: 0x44, Every: time.Second}}
		}, `sensor sht31@1:0x44: unknown driver "sht31"`},
		"no interval": {func(o *sensors.Options) { o.Sensors = []sensors.Sensor{{Driver: "sht3x", Bus: "1", Address: 0x44}} }, "interval 0s is not positive"},
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			tc.mod(&o)
			if _, err := sensors.New(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := sensors.New(ok); err != nil {
		t.Error(err)
	}
}
