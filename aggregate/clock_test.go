package aggregate

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// stepClock is a Clock whose wall clock can be stepped apart from its
// elapsed time, and whose synchronization is set by hand.
type stepClock struct {
	wall    time.Time
	elapsed time.Duration
	synced  bool
}

func (c *stepClock) Now() (time.Time, bool) { return c.wall, c.synced }
func (c *stepClock) Elapsed() time.Duration { return c.elapsed }

// advance lets d pass; step moves the wall clock alone.
func (c *stepClock) advance(d time.Duration) { c.wall, c.elapsed = c.wall.Add(d), c.elapsed+d }
func (c *stepClock) step(d time.Duration)    { c.wall = c.wall.Add(d) }

// TestIdleCloseOnElapsedTime: a device's silence is measured on elapsed
// time, so a backward step of the wall clock does not keep its windows
// open, and a forward step does not close them all at once.
func TestIdleCloseOnElapsedTime(t *testing.T) {
	for name, tc := range map[string]struct {
		step time.Duration
	}{
		"2h back":    {-2 * time.Hour},
		"5h forward": {5 * time.Hour},
		"no step":    {0},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			clk := &stepClock{wall: base, elapsed: time.Hour, synced: true}
			var got []Summary
			a, err := New(cfg, clk, func(s Summary) { got = append(got, s) })
			if err != nil {
				t.Fatal(err)
			}
			a.Add(Reading{Device: "d", Metric: "m", Time: sec(10), Value: 1})
			clk.advance(time.Second)
			a.Add(Reading{Device: "d", Metric: "m", Time: sec(11), Value: 2})
			clk.step(tc.step)
			clk.advance(cfg.IdleClose - time.Nanosecond)
			a.Tick()
			if len(got) != 0 {
				t.Fatalf("closed %d windows %v before the device was silent for idle_close", len(got), cfg.IdleClose)
			}
			clk.advance(time.Nanosecond)
			a.Tick()
			if len(got) != 1 {
				t.Fatalf("%d summaries after idle_close of elapsed time, want 1", len(got))
			}
			checkSummary(t, got[0], want{dev: "d", metric: "m", start: 0, points: [][2]float64{{10, 1}, {11, 2}}}, cfg)
		})
	}
}

// TestUntrustedTimes: a reading stamped before the floor is never
// aggregated at its time. A device's is stamped on arrival when the
// clock is synchronized (and counted as replaced) or refused; a
// gateway-stamped one before the floor is refused; the future is judged
// only against a synchronized clock.
func TestUntrustedTimes(t *testing.T) {
	epoch := time.Unix(10, 0).UTC() // a device that never synced: 1970-01-01T00:00:10Z
	for name, tc := range map[string]struct {
		policy UntrustedPolicy
		synced bool
		r      Reading
		want   Outcome
		at     time.Time // the time it is aggregated at, when accepted
		timing Timing
	}{
		"1970, synchronized: arrival": {UntrustedArrival, true, Reading{Time: epoch}, Aggregated, sec(30), ReplacedTime},
		"1970, unsynchronized":        {UntrustedArrival, false, Reading{Time: epoch}, DeviceClockUnset, time.Time{}, 0},
		"1970, deadletter policy":     {UntrustedDeadLetter, true, Reading{Time: epoch}, DeviceClockUnset, time.Time{}, 0},
		"just after the floor":        {UntrustedDeadLetter, true, Reading{Time: base.Add(-300 * 24 * time.Hour)}, Aggregated, base.Add(-300 * 24 * time.Hour), DeviceTime},
		"gateway clock at 1970":       {UntrustedArrival, false, Reading{Time: epoch, Timing: GatewayTime}, GatewayClockUnset, time.Time{}, 0},
		"future, synchronized":        {UntrustedArrival, true, Reading{Time: sec(30 + 121)}, Future, time.Time{}, 0},
		"future, unsynchronized":      {UntrustedArrival, false, Reading{Time: sec(30 + 121)}, Aggregated, sec(30 + 121), DeviceTime},
		"3 days ahead, unsynchronized": {UntrustedArrival, false, Reading{Time: sec(30).Add(72 * time.Hour)}, Aggregated,
			sec(30).Add(72 * time.Hour), DeviceTime},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.TimeFloor = base.AddDate(-1, 0, 0)
			cfg.UntrustedDeviceTime = tc.policy
			clk := &stepClock{wall: sec(30), elapsed: time.Hour, synced: tc.synced}
			var got []Summary
			a, _ := New(cfg, clk, func(s Summary) { got = append(got, s) })
			r := tc.r
			r.Device, r.Metric, r.Value = "d", "m", 7
			if o := a.Add(r); o != tc.want {
				t.Fatalf("outcome %v, want %v", o, tc.want)
			}
			a.Flush()
			if !tc.want.Accepted() {
				if c := a.Counts(); len(got) != 0 || c.Of(tc.want) != 1 {
					t.Errorf("refused reading made %d summaries, counted %d", len(got), c.Of(tc.want))
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("%d summaries, want 1", len(got))
			}
			ws := time.Unix(0, tc.at.UnixNano()-tc.at.UnixNano()%int64(time.Minute)).UTC()
			if s := got[0]; !s.WindowStart.Equal(ws) || s.Count != 1 || s.Sum != 7 || s.First != 7 || s.Last != 7 {
				t.Errorf("summary %+v, want one reading of 7 in the window of %v", s, ws)
			}
			wantSource, wantReplaced := SourceDevice, int64(0)
			if tc.timing == ReplacedTime {
				wantSource, wantReplaced = SourceGateway, 1
			}
			if s := got[0]; s.TimeSource != wantSource || s.TimeReplaced != wantReplaced || s.TimeRebased != 0 || s.TimeUnverified != 0 {
				t.Errorf("time source %q, replaced %d, rebased %d, unverified %d; want %q, %d, 0, 0",
					s.TimeSource, s.TimeReplaced, s.TimeRebased, s.TimeUnverified, wantSource, wantReplaced)
			}
			var st DeviceStat
			a.DeviceStats(func(d DeviceStat) bool { st = d; return false })
			if wantUnset := uint64(0); tc.timing == ReplacedTime {
				if st.ClockUnset != 1 {
					t.Errorf("device's clock-unset count %d, want 1", st.ClockUnset)
				}
			} else if st.ClockUnset != wantUnset {
				t.Errorf("device's clock-unset count %d, want 0", st.ClockUnset)
			}
		})
	}
}

// TestDeviceSkew: devices whose clocks are off by more than MaxDeviceSkew
// for a whole DeviceSkewPeriod are reported, with the offset measured;
// a synced one is not, and nothing is measured while the gateway's clock
// is not synchronized. Their readings keep their times.
func TestDeviceSkew(t *testing.T) {
	for name, tc := range map[string]struct {
		skew   time.Duration
		synced bool
		delay  time.Duration // of every reading in transit
		want   bool
	}{
		"synced device":             {0, true, 20 * time.Millisecond, false},
		"90s ahead":                 {90 * time.Second, true, 20 * time.Millisecond, true},
		"40s behind, within bound":  {-40 * time.Second, true, 0, false},
		"3 days behind":             {-72 * time.Hour, true, 20 * time.Millisecond, true},
		"90s ahead, gateway unsync": {90 * time.Second, false, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.AllowedLateness = 100 * time.Hour
			cfg.MaxFutureSkew = 2 * time.Minute
			clk := &stepClock{wall: base, elapsed: time.Hour, synced: tc.synced}
			var got []Summary
			a, _ := New(cfg, clk, func(s Summary) { got = append(got, s) })
			sum := 0.0
			// A reading every 10 s for 6 minutes: more than a period.
			for i := range 37 {
				taken := base.Add(time.Duration(i) * 10 * time.Second)
				clk.wall = taken.Add(tc.delay)
				clk.elapsed = time.Hour + taken.Sub(base) + tc.delay
				if o := a.Add(Reading{Device: "d", Metric: "m", Time: taken.Add(tc.skew), Value: float64(i)}); o != Aggregated {
					t.Fatalf("reading %d: %v", i, o)
				}
				sum += float64(i)
			}
			a.Flush()
			var st DeviceStat
			a.DeviceStats(func(d DeviceStat) bool { st = d; return false })
			if st.ClockSkewed != tc.want || a.SkewedDevices() != map[bool]int{true: 1}[tc.want] {
				t.Errorf("skewed %v (%d devices), want %v; %+v", st.ClockSkewed, a.SkewedDevices(), tc.want, st)
			}
			if tc.synced {
				if want := tc.skew - tc.delay; !st.ClockMeasured || st.ClockOffset != want {
					t.Errorf("offset %v (measured %v), want %v", st.ClockOffset, st.ClockMeasured, want)
				}
			} else if st.ClockMeasured {
				t.Errorf("measured %v against an unsynchronized clock", st.ClockOffset)
			}
			// Every reading is in a window of its own time.
			var n int64
			total := 0.0
			for _, s := range got {
				n += s.Count
				total += s.Sum
				if first := base.Add(tc.skew); s.WindowStart.Before(first.Truncate(time.Minute)) {
					t.Errorf("window %v before the first reading's time %v", s.WindowStart, first)
				}
			}
			if n != 37 || math.Abs(total-sum) > 1e-9 {
				t.Errorf("summaries hold %d readings summing %v, want 37 and %v", n, total, sum)
			}
		})
	}
}

// TestTimeQuality: a window counts its readings by where their times came
// from, across revisions and a snapshot, and says so in every summary.
func TestTimeQuality(t *testing.T) {
	cfg := testConfig()
	cfg.TimeFloor = base.AddDate(-1, 0, 0)
	clk := &stepClock{wall: sec(30), elapsed: time.Hour, synced: true}
	var got []Summary
	a, _ := New(cfg, clk, func(s Summary) { got = append(got, s) })
	for _, r := range []Reading{
		{Time: sec(1), Timing: DeviceTime},
		{Time: sec(2), Timing: GatewayTime},
		{Time: time.Unix(5, 0), Timing: DeviceTime}, // 1970: stamped at 30 s
		{Time: sec(3), Timing: RebasedTime},
		{Time: sec(4), Timing: UnverifiedTime},
		{Time: sec(70), Timing: GatewayTime}, // closes [0,60)
		{Time: sec(71), Timing: GatewayTime},
	} {
		r.Device, r.Metric, r.Value = "d", "m", 1
		if o := a.Add(r); o != Aggregated {
			t.Fatalf("%+v: %v", r, o)
		}
	}
	b, _ := New(cfg, clk, func(s Summary) { got = append(got, s) })
	if err := b.Restore(a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if o := b.Add(Reading{Device: "d", Metric: "m", Time: sec(10), Value: 1}); o != Revised { // a device's late reading
		t.Fatalf("late reading: %v", o)
	}
	b.Flush()
	type q struct {
		source                        string
		replaced, rebased, unverified int64
		count                         int64
	}
	var qs []q
	for _, s := range got {
		qs = append(qs, q{s.TimeSource, s.TimeReplaced, s.TimeRebased, s.TimeUnverified, s.Count})
	}
	want := []q{{SourceMixed, 1, 1, 1, 5}, {SourceMixed, 1, 1, 1, 6}, {SourceGateway, 0, 0, 0, 2}}
	if fmt.Sprint(qs) != fmt.Sprint(want) {
		t.Errorf("time quality %v, want %v", qs, want)
	}
}
