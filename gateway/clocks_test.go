package gateway_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/clock"
)

// manualStack is a restartable gateway on a clock moved by hand.
func manualStack(t *testing.T, clk *clock.Manual, tweak func(*configs.Config)) *restartable {
	return newRestartable(t, clk.Now, func(o *gateway.Options) { o.Clock = clk }, tweak)
}

// waitTick returns once the gateway has applied a tick after everything
// applied so far (one is due after any reading).
func (r *restartable) waitTick() {
	r.t.Helper()
	n := r.gw.TicksApplied()
	for deadline := time.Now().Add(patience); r.gw.TicksApplied() == n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			r.t.Fatalf("no tick applied in %v", patience)
		}
	}
}

// deadLetters reads n dead letters and returns "device:reason" of each,
// sorted.
func (r *restartable) deadLetters(n int) string {
	r.t.Helper()
	var out []string
	for _, m := range kafkatest.Consume(r.t, r.brokers, deadTopic, n, time.Minute) {
		var d struct{ Device, Reason string }
		if err := json.Unmarshal(m.Value, &d); err != nil {
			r.t.Fatalf("dead letter %s: %v", m.Value, err)
		}
		out = append(out, d.Device+":"+d.Reason)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func vt(v float64, t time.Time) string {
	return fmt.Sprintf(`{"v":%g,"t":"%s"}`, v, t.UTC().Format(time.RFC3339Nano))
}

// TestUnsynchronizedBackwardStep: the clock is not synchronized and steps
// 2 h back (a wrong date -s, a real-time clock read badly): the gateway
// keeps time by the monotonic clock, so bare readings (not held here:
// clock.hold_max_bytes 0, so aggregated at once, unverified) go on in their
// window, across a restart, and idle_close still fires; a device that
// stamps its own readings is not affected.
func TestUnsynchronizedBackwardStep(t *testing.T) {
	clk := clock.NewManual(t0, false)
	r := manualStack(t, clk, func(c *configs.Config) { c.Clock.HoldMaxBytes = 0 })
	r.publish("dev-a", "sensors/dev-a/t", "1")
	clk.Advance(10 * time.Second)
	clk.Step(-2 * time.Hour)
	r.publish("dev-a", "sensors/dev-a/t", "2") // at t0+10s by the gateway's time
	r.restart()                                // the same boot: flushes dev-a's window
	clk.Advance(5 * time.Second)
	r.publish("dev-a", "sensors/dev-a/t", "3") // t0+15s: revises its window
	r.publish("dev-s", "sensors/dev-s/t", vt(7, t0.Add(16*time.Second)))
	clk.Advance(91 * time.Second)
	// dev-s's window closes by idle_close while the gateway runs.
	got := r.summaries(3, time.Minute)
	checkWindows(t, got, []sent{{"dev-a", "t", "", t0, 1}, {"dev-a", "t", "", t0.Add(10 * time.Second), 2},
		{"dev-a", "t", "", t0.Add(15 * time.Second), 3}, {"dev-s", "t", "", t0.Add(16 * time.Second), 7}})
	if a := got[winKey{"dev-a", "t", t0.Truncate(time.Minute)}]; a.Revision != 1 || a.Late != 1 {
		t.Errorf("dev-a's window: revision %d late %d, want 1 and 1 (revised after the restart)", a.Revision, a.Late)
	}
	checkTimes(t, got, map[string]string{"dev-a/t@2026-11-30T10:05:00Z": "gateway/0/0/3"}, "device/0/0/0")
}

// TestSynchronizedForwardStepMidWindow: NTP steps a synchronized clock 5 h
// forward while windows are open. Bare readings follow the clock (a
// synchronized clock is right); a device stamping its own readings keeps
// its window open until it is idle for idle_close of elapsed time, rather
// than having it closed by the step; and after a restart the gateway goes
// on from the stepped time.
func TestSynchronizedForwardStepMidWindow(t *testing.T) {
	clk := clock.NewManual(t0, true)
	r := manualStack(t, clk, nil)
	r.publish("dev-c", "sensors/dev-c/t", vt(1, t0.Add(time.Second)))
	r.publish("dev-b", "sensors/dev-b/t", "10")
	r.waitTick()
	clk.Step(5 * time.Hour)
	r.publish("dev-b", "sensors/dev-b/t", "11") // 15:05:30: closes dev-b's 10:05 window
	r.waitTick()                                // before, this tick closed every window: 5 h "silent"
	r.publish("dev-c", "sensors/dev-c/t", vt(2, t0.Add(20*time.Second)))
	r.restart() // flushes
	clk.Advance(5 * time.Second)
	r.publish("dev-b", "sensors/dev-b/t", "12") // 15:05:35: revises its window, flushed at the restart
	r.stop()
	stepped := t0.Add(5 * time.Hour)
	got := r.summaries(4, time.Minute)
	checkWindows(t, got, []sent{{"dev-c", "t", "", t0.Add(time.Second), 1}, {"dev-c", "t", "", t0.Add(20 * time.Second), 2},
		{"dev-b", "t", "", t0, 10}, {"dev-b", "t", "", stepped, 11}, {"dev-b", "t", "", stepped.Add(5 * time.Second), 12}})
	if c := got[winKey{"dev-c", "t", t0.Truncate(time.Minute)}]; c.Revision != 0 || c.Late != 0 {
		t.Errorf("dev-c's window: revision %d late %d, want one emission of both readings", c.Revision, c.Late)
	}
}

// TestDeviceClocks: four devices publish every 10 s for 6 minutes to a
// gateway whose clock is synchronized: one whose clock was never set
// (1970), one whose clock is 3 days behind (a stale fake-hwclock), one 90 s
// ahead, and one synchronized. The 1970 readings are stamped on arrival;
// the others keep their own times; the 3-day and 90 s devices are reported
// with their offsets, the synchronized one is not. Every summary is exact.
func TestDeviceClocks(t *testing.T) {
	clk := clock.NewManual(t0, true)
	r := manualStack(t, clk, func(c *configs.Config) { c.Aggregate.AllowedLateness = configs.Duration(time.Hour) })
	offsets := map[string]time.Duration{"stale": -72 * time.Hour, "ahead": 90 * time.Second, "synced": 0}
	var truth []sent
	for i := range 37 {
		now := clk.Now()
		v := float64(i) + 0.5
		r.publish("esp", "sensors/esp/t", vt(v, time.Unix(int64(10+i), 0)))
		truth = append(truth, sent{"esp", "t", "", now, v})
		for _, dev := range []string{"stale", "ahead", "synced"} {
			at := now.Add(offsets[dev])
			r.publish(dev, "sensors/"+dev+"/t", vt(v, at))
			truth = append(truth, sent{dev, "t", "", at, v})
		}
		clk.Advance(10 * time.Second)
	}
	st := r.gw.Stats()
	if st.SkewedDevices != 2 {
		t.Errorf("%d devices reported skewed, want 2", st.SkewedDevices)
	}
	for _, d := range st.DeviceList {
		want, skewed := offsets[d.ID], d.ID == "stale" || d.ID == "ahead"
		if d.ID == "esp" {
			if d.ClockUnset != 37 || d.ClockMeasured {
				t.Errorf("esp: %d readings with the clock unset (want 37), measured %v", d.ClockUnset, d.ClockMeasured)
			}
			continue
		}
		if d.ClockSkewed != skewed || !d.ClockMeasured || d.ClockOffset != want {
			t.Errorf("%s: skewed %v, offset %v (measured %v); want %v, %v", d.ID, d.ClockSkewed, d.ClockOffset, d.ClockMeasured, skewed, want)
		}
	}
	if o := st.Outcomes; o["aggregated"] != 4*37 || o["device_clock_unset"] != 0 {
		t.Errorf("outcomes %v: want all 148 aggregated", o)
	}
	r.stop()
	want := expected(truth, time.Minute)
	got := r.summaries(len(want), time.Minute)
	checkWindows(t, got, truth)
	// esp's windows are stamped by the gateway, every reading replaced;
	// the others by their devices.
	espTimes := map[string]string{}
	for k, s := range got {
		if k.dev == "esp" {
			espTimes[k.String()] = fmt.Sprintf("gateway/%d/0/0", s.Count)
		}
	}
	checkTimes(t, got, espTimes, "device/0/0/0")
}

// TestDeviceClockUnsetWhileUnsynchronized: while the gateway's own clock
// is not synchronized, a 1970 reading cannot be stamped on arrival: it is
// dead-lettered as device_clock_unset, as it is always with
// untrusted_device_time: deadletter. Times are not judged against an
// unsynchronized clock: a synced device's reading 3 days "ahead" of a
// gateway that booted at a stale time is aggregated at its time.
func TestDeviceClockUnsetWhileUnsynchronized(t *testing.T) {
	stale := t0.Add(-72 * time.Hour)
	for name, tc := range map[string]struct {
		synced bool
		policy string
	}{
		"unsynchronized, arrival":  {false, "arrival"},
		"synchronized, deadletter": {true, "deadletter"},
	} {
		t.Run(name, func(t *testing.T) {
			wall := t0
			if !tc.synced {
				wall = stale // booted with the time it last saved
			}
			clk := clock.NewManual(wall, tc.synced)
			r := manualStack(t, clk, func(c *configs.Config) { c.Aggregate.UntrustedDeviceTime = tc.policy })
			r.publish("esp", "sensors/esp/t", `{"v":3,"t":"1970-01-01T00:00:10Z"}`)
			r.publish("dev-s", "sensors/dev-s/t", vt(7, t0))
			r.restart()
			r.publish("esp", "sensors/esp/t", `{"v":4,"t":"1970-01-01T00:00:15Z"}`)
			r.stop()
			if got := r.deadLetters(2); got != "esp:device_clock_unset esp:device_clock_unset" {
				t.Errorf("dead letters %s, want two device_clock_unset", got)
			}
			checkWindows(t, r.summaries(1, time.Minute), []sent{{"dev-s", "t", "", t0, 7}})
		})
	}
}

// TestClockStatus: the gateway reports its clock's synchronization and
// every step with its size; a change of synchronization is journaled, so
// that times are judged against the clock from then on (here a reading an
// hour ahead, taken while unsynchronized and refused once synchronized),
// and survives a restart.
func TestClockStatus(t *testing.T) {
	clk := clock.NewManual(t0, false)
	r := manualStack(t, clk, nil)
	ahead := t0.Add(time.Hour)
	r.publish("dev-f", "sensors/dev-f/t", vt(1, ahead))
	if c := r.gw.Stats().Clock; c.Synchronized || c.Steps != 0 || c.Source != "manual" || c.Boot == "" {
		t.Errorf("clock %+v: want unsynchronized, no steps", c)
	}
	clk.SetSynchronized(true)
	clk.Step(-3 * time.Second)
	st := settled(t, r.gw, func(st gateway.Stats) bool { return st.Clock.Synchronized && st.Clock.Steps == 1 })
	if c := st.Clock; !c.Synchronized || c.Steps != 1 || c.LastStep != -3*time.Second || !c.LastStepAt.Equal(t0.Add(-3*time.Second)) || c.Offset != 0 {
		t.Errorf("clock %+v: want synchronized, one step of -3s", c)
	}
	r.publish("dev-f", "sensors/dev-f/t", vt(2, ahead.Add(time.Second)))
	r.restart()
	r.publish("dev-f", "sensors/dev-f/t", vt(3, ahead.Add(2*time.Second)))
	r.stop()
	if got := r.deadLetters(2); got != "dev-f:future dev-f:future" {
		t.Errorf("dead letters %s, want the two readings an hour ahead of the synchronized clock", got)
	}
	checkWindows(t, r.summaries(1, time.Minute), []sent{{"dev-f", "t", "", ahead, 1}})
}
