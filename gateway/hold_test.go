package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/firmware-sim/chips"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/clock"
)

// synchronize steps the clock to true time and sets it synchronized, as
// chrony's makestep does once NTP answers, and waits until the gateway
// has seen it.
func (r *restartable) synchronize(clk *clock.Manual, truth time.Time) {
	r.t.Helper()
	clk.Step(truth.Sub(clk.Now()))
	clk.SetSynchronized(true)
	if st := settled(r.t, r.gw, func(st gateway.Stats) bool { return st.Clock.Synchronized && st.Hold.Readings == 0 }); st.Hold.Readings != 0 {
		r.t.Fatalf("still %d readings held after the clock was synchronized", st.Hold.Readings)
	}
}

// TestBootAt1970: a gateway boots at 1970, unsynchronized. Bare readings
// are held (none is aggregated at 1970), across a restart; a device that
// stamps its own readings is aggregated at once. When NTP steps the clock
// to true time, the held readings are re-based by the monotonic clock and
// aggregated at the times they were taken.
func TestBootAt1970(t *testing.T) {
	boot := time.Date(1970, 1, 1, 0, 0, 12, 0, time.UTC)
	clk := clock.NewManual(boot, false)
	r := manualStack(t, clk, nil)
	r.publish("dev-b", "sensors/dev-b/t", "1")       // taken at t0 by true time
	r.publish("dev-s", "sensors/dev-s/t", vt(7, t0)) // a synced device
	r.publish("dev-b", "sensors/dev-b", `{"rh":40}`) // an object without a time
	if h := r.gw.Stats().Hold; h.Readings != 2 || h.Publications != 2 || h.Bytes == 0 {
		t.Errorf("hold %+v: want dev-b's 2 readings", h)
	}
	r.restart() // the same boot: the hold survives
	clk.Advance(10 * time.Second)
	r.publish("dev-b", "sensors/dev-b/t", "2") // t0+10s
	clk.Advance(20 * time.Second)
	r.synchronize(clk, t0.Add(30*time.Second))
	st := r.gw.Stats()
	if st.Hold.Rebased != 3 || st.Hold.Unverified != 0 || st.Outcomes["gateway_clock_unset"] != 0 {
		t.Errorf("hold %+v, outcomes %v: want 3 rebased", st.Hold, st.Outcomes)
	}
	r.publish("dev-b", "sensors/dev-b/t", "3") // t0+30s, synchronized: not held
	r.restart()
	r.stop()
	got := r.summaries(4, time.Minute)
	checkWindows(t, got, []sent{{"dev-b", "t", "", t0, 1}, {"dev-b", "t", "", t0.Add(10 * time.Second), 2}, {"dev-b", "rh", "", t0, 40},
		{"dev-b", "t", "", t0.Add(30 * time.Second), 3}, {"dev-s", "t", "", t0, 7}})
	checkTimes(t, got, map[string]string{"dev-b/t@2026-11-30T10:05:00Z": "gateway/0/2/0", "dev-b/t@2026-11-30T10:06:00Z": "gateway/0/0/0",
		"dev-b/rh@2026-11-30T10:05:00Z": "gateway/0/1/0"}, "device/0/0/0")
}

// TestStaleClockForwardStep: a Raspberry Pi boots with the time fake-hwclock
// saved 3 days ago; NTP steps it 72 h forward mid-window. Bare readings
// taken before the step land at their true times; so do the device-stamped
// readings of a synced device, which were not refused as "future" while
// the gateway's clock was behind.
func TestStaleClockForwardStep(t *testing.T) {
	clk := clock.NewManual(t0.Add(-72*time.Hour), false)
	r := manualStack(t, clk, nil)
	var truth []sent
	for i := range 6 {
		taken := t0.Add(time.Duration(i) * 10 * time.Second)
		r.publish("dev-b", "sensors/dev-b/t", fmt.Sprint(i))
		r.publish("dev-s", "sensors/dev-s/t", vt(float64(i), taken))
		truth = append(truth, sent{"dev-b", "t", "", taken, float64(i)}, sent{"dev-s", "t", "", taken, float64(i)})
		if i == 2 {
			r.restart()
		}
		clk.Advance(10 * time.Second)
	}
	r.synchronize(clk, t0.Add(60*time.Second))
	r.restart()
	r.stop()
	got := r.summaries(4, time.Minute)
	checkWindows(t, got, truth)
	checkTimes(t, got, map[string]string{"dev-b/t@2026-11-30T10:05:00Z": "gateway/0/3/0", "dev-b/t@2026-11-30T10:06:00Z": "gateway/0/3/0"}, "device/0/0/0")
}

// TestNeverSynchronized: the clock never synchronizes. After
// clock.hold_max_age the held readings are aggregated at the gateway's
// time, marked unverified; a gateway at 1970 ships none at 1970 (they are
// dead-lettered as gateway_clock_unset). Readings of an earlier boot are
// unverified too, even once the clock synchronizes.
func TestNeverSynchronized(t *testing.T) {
	t.Run("stale clock, max age", func(t *testing.T) {
		stale := t0.Add(-72 * time.Hour)
		clk := clock.NewManual(stale, false)
		r := manualStack(t, clk, func(c *configs.Config) { c.Clock.HoldMaxAge = configs.Duration(time.Minute) })
		r.publish("dev-b", "sensors/dev-b/t", "1")
		clk.Advance(30 * time.Second)
		r.publish("dev-b", "sensors/dev-b/t", "2")
		clk.Advance(30 * time.Second) // a minute since the first: released at the next tick
		st := settled(t, r.gw, func(st gateway.Stats) bool { return st.Hold.Unverified == 2 })
		if st.Hold.Unverified != 2 || st.Hold.Readings != 0 {
			t.Errorf("hold %+v: want 2 released unverified", st.Hold)
		}
		r.stop()
		got := r.summaries(2, time.Minute) // 10:05:30 and 10:06:00, 3 days ago
		checkWindows(t, got, []sent{{"dev-b", "t", "", stale, 1}, {"dev-b", "t", "", stale.Add(30 * time.Second), 2}})
		checkTimes(t, got, nil, "gateway/0/0/1")
	})
	t.Run("1970, max age", func(t *testing.T) {
		clk := clock.NewManual(time.Unix(100, 0), false)
		r := manualStack(t, clk, func(c *configs.Config) { c.Clock.HoldMaxAge = configs.Duration(time.Minute) })
		r.publish("dev-b", "sensors/dev-b/t", "1")
		clk.Advance(time.Minute)
		settled(t, r.gw, func(st gateway.Stats) bool { return st.Hold.Unverified == 1 })
		r.stop()
		if got := r.deadLetters(1); got != "dev-b:gateway_clock_unset" {
			t.Errorf("dead letters %s", got)
		}
		if n := r.gw.Stats().Summaries; n != 0 {
			t.Errorf("%d summaries, want none", n)
		}
	})
	t.Run("reboot before synchronization", func(t *testing.T) {
		stale := t0.Add(-72 * time.Hour)
		clk := clock.NewManual(stale, false)
		r := manualStack(t, clk, nil)
		r.publish("dev-b", "sensors/dev-b/t", "1") // boot 1: at the stale time, unverified
		r.stop()
		clk.Reboot(stale.Add(time.Hour), false)
		r.start()
		r.publish("dev-b", "sensors/dev-b/t", "2") // boot 2: re-based
		clk.Advance(5 * time.Second)
		r.synchronize(clk, t0.Add(5*time.Second))
		r.stop()
		got := r.summaries(2, time.Minute)
		checkWindows(t, got, []sent{{"dev-b", "t", "", stale, 1}, {"dev-b", "t", "", t0, 2}})
		checkTimes(t, got, map[string]string{"dev-b/t@2026-11-27T10:05:00Z": "gateway/0/0/1", "dev-b/t@2026-11-30T10:05:00Z": "gateway/0/1/0"}, "")
	})
}

// TestSensorsHeldUntilSynchronized: the gateway's own I²C sensor polled
// while the clock is at 1970 and unsynchronized: its readings are held,
// then re-based once it is; none is aggregated at 1970 and every one the
// chip measured is counted.
func TestSensorsHeldUntilSynchronized(t *testing.T) {
	bus := chips.NewBus("edgegate-hold-i2c")
	bh := chips.NewBH1750()
	bus.Attach(0x23, bh)
	bh.Set(250)
	if err := i2creg.Register(bus.String(), nil, -1, func() (i2c.BusCloser, error) { return bus, nil }); err != nil {
		t.Fatal(err)
	}
	defer i2creg.Unregister(bus.String())
	clk := clock.NewManual(time.Unix(100, 0), false)
	r := manualStack(t, clk, func(c *configs.Config) {
		c.Sensors = []configs.Sensor{{Bus: bus.String(), Address: 0x23, Driver: "bh1750", Every: configs.Duration(100 * time.Millisecond), Device: "board"}}
	})
	st := settled(t, r.gw, func(st gateway.Stats) bool { return st.Hold.Readings >= 3 })
	if st.Hold.Readings < 3 || st.Summaries != 0 {
		t.Fatalf("hold %+v, %d summaries: want sensor readings held", st.Hold, st.Summaries)
	}
	r.synchronize(clk, t0)
	clk.Advance(2 * time.Minute) // what follows is in a later window
	r.stop()
	n := bh.Count()
	st = r.gw.Stats()
	var total, rebased int64
	windows := 0
	for k, s := range r.summaries(int(st.Summaries), time.Minute) {
		if k.start.Before(t0.Truncate(time.Minute)) {
			t.Errorf("window %v before the true time", k)
		}
		if s.Sum != 250*float64(s.Count) || s.TimeSource != "gateway" || s.TimeUnverified != 0 {
			t.Errorf("%v: %+v", k, s)
		}
		total += s.Count
		rebased += s.TimeRebased
		windows++
	}
	if total != int64(n) || rebased < 3 || uint64(rebased) != st.Hold.Rebased {
		t.Errorf("%d readings in %d windows (%d rebased), the chip measured %d, %d released", total, windows, rebased, n, st.Hold.Rebased)
	}
}
