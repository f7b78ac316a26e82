package aggregate

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// base is an epoch-aligned minute; t0 + 0s is the start of a window.
var base = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// clock is an injected, manually advanced clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// step is one event in a scenario: a reading (at wall time wall, event time
// ev, both seconds after base), or a Tick at wall time wall.
type step struct {
	wall   float64
	tick   bool
	dev    string
	metric string
	ev     float64
	v      float64
	want   Outcome
}

func rd(wall float64, dev, metric string, ev, v float64, want Outcome) step {
	return step{wall: wall, dev: dev, metric: metric, ev: ev, v: v, want: want}
}

func tick(wall float64) step { return step{wall: wall, tick: true} }

// want describes one expected summary; its statistics are computed by
// refStats from the listed (event time, value) pairs, independently of the
// aggregator's incremental arithmetic.
type want struct {
	dev, metric string
	start       float64 // seconds after base
	revision    int
	late        int64
	points      [][2]float64 // {event time, value} in arrival order
}

func sec(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }

// refStats computes a summary's statistics with a textbook two-pass
// algorithm.
func refStats(points [][2]float64) (count int64, mn, mx, sum, mean, first, last, sd float64) {
	mn, mx = math.Inf(1), math.Inf(-1)
	firstT, lastT := math.Inf(1), math.Inf(-1)
	for _, p := range points {
		count++
		sum += p[1]
		mn = math.Min(mn, p[1])
		mx = math.Max(mx, p[1])
		if p[0] < firstT {
			firstT, first = p[0], p[1]
		}
		if p[0] >= lastT {
			lastT, last = p[0], p[1]
		}
	}
	mean = sum / float64(count)
	var ss float64
	for _, p := range points {
		ss += (p[1] - mean) * (p[1] - mean)
	}
	sd = math.Sqrt(ss / float64(count))
	return
}

func close(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func checkSummary(t *testing.T, got Summary, w want, cfg Config) {
	t.Helper()
	count, mn, mx, sum, mean, first, last, sd := refStats(w.points)
	ws := sec(w.start)
	if got.Device != w.dev || got.Metric != w.metric || !got.WindowStart.Equal(ws) ||
		!got.WindowEnd.Equal(ws.Add(cfg.Window)) || got.Revision != w.revision || got.Late != w.late {
		t.Errorf("summary identity = %s/%s %v..%v rev %d late %d, want %s/%s %v..%v rev %d late %d",
			got.Device, got.Metric, got.WindowStart, got.WindowEnd, got.Revision, got.Late,
			w.dev, w.metric, ws, ws.Add(cfg.Window), w.revision, w.late)
		return
	}
	if got.Count != count || got.Min != mn || got.Max != mx || !close(got.Sum, sum) ||
		!close(got.Mean, mean) || got.First != first || got.Last != last || !close(got.Stddev, sd) {
		t.Errorf("%s/%s@%v rev %d stats = n%d min%g max%g sum%g mean%g first%g last%g sd%g; want n%d min%g max%g sum%g mean%g first%g last%g sd%g",
			w.dev, w.metric, w.start, w.revision,
			got.Count, got.Min, got.Max, got.Sum, got.Mean, got.First, got.Last, got.Stddev,
			count, mn, mx, sum, mean, first, last, sd)
	}
	if got.Gateway != cfg.Gateway {
		t.Errorf("gateway = %q, want %q", got.Gateway, cfg.Gateway)
	}
	if wantID := SummaryID(cfg.Gateway, w.dev, w.metric, ws, w.revision); got.ID != wantID {
		t.Errorf("id = %s, want %s", got.ID, wantID)
	}
}

func testConfig() Config {
	c := DefaultConfig()
	c.Gateway = "gw-test"
	c.Window = time.Minute
	c.MaxOutOfOrder = 5 * time.Second
	c.IdleClose = 90 * time.Second
	c.AllowedLateness = 10 * time.Minute
	c.MaxFutureSkew = 2 * time.Minute
	return c
}

func TestAggregator(t *testing.T) {
	tests := map[string]struct {
		cfg   func(*Config)
		steps []step
		flush bool
		want  []want
	}{
		"in order, window closes when watermark passes its end": {
			steps: []step{
				rd(1, "d1", "temp", 1, 20, Aggregated),
				rd(2, "d1", "temp", 30, 22, Aggregated),
				rd(3, "d1", "temp", 59.999, 21, Aggregated),
				rd(4, "d1", "temp", 64, 25, Aggregated), // watermark 59: nothing closes yet
				rd(5, "d1", "temp", 65, 26, Aggregated), // watermark 60: [0,60) closes
			},
			want: []want{{dev: "d1", metric: "temp", start: 0, points: [][2]float64{{1, 20}, {30, 22}, {59.999, 21}}}},
		},
		"out of order within bound lands in its window; first/last by event time": {
			steps: []step{
				rd(1, "d1", "temp", 50, 5, Aggregated),
				rd(2, "d1", "temp", 62, 7, Aggregated),    // watermark 57
				rd(3, "d1", "temp", 58, 3, Aggregated),    // behind max but ahead of watermark
				rd(4, "d1", "temp", 10, 9, Aggregated),    // earliest event: becomes first
				rd(130, "d1", "temp", 130, 1, Aggregated), // watermark 125: both windows close
			},
			want: []want{
				{dev: "d1", metric: "temp", start: 0, points: [][2]float64{{50, 5}, {58, 3}, {10, 9}}},
				{dev: "d1", metric: "temp", start: 60, points: [][2]float64{{62, 7}}},
			},
		},
		"late reading within lateness emits an accumulating revision": {
			steps: []step{
				rd(1, "d1", "rh", 10, 40, Aggregated),
				rd(2, "d1", "rh", 20, 42, Aggregated),
				rd(3, "d1", "rh", 70, 50, Aggregated), // closes [0,60) rev 0
				rd(4, "d1", "rh", 5, 38, Revised),     // rev 1, new first
				rd(5, "d1", "rh", 59, 44, Revised),    // rev 2, new last
			},
			want: []want{
				{dev: "d1", metric: "rh", start: 0, points: [][2]float64{{10, 40}, {20, 42}}},
				{dev: "d1", metric: "rh", start: 0, revision: 1, late: 1, points: [][2]float64{{10, 40}, {20, 42}, {5, 38}}},
				{dev: "d1", metric: "rh", start: 0, revision: 2, late: 2, points: [][2]float64{{10, 40}, {20, 42}, {5, 38}, {59, 44}}},
			},
		},
		"late reading for a window that never had data is revision 0 with late 1": {
			steps: []step{
				rd(130, "d1", "rh", 130, 1, Aggregated),
				rd(131, "d1", "rh", 70, 2, Revised),
			},
			flush: true,
			want: []want{
				{dev: "d1", metric: "rh", start: 60, late: 1, points: [][2]float64{{70, 2}}},
				{dev: "d1", metric: "rh", start: 120, points: [][2]float64{{130, 1}}},
			},
		},
		"beyond allowed lateness is refused, watermark unchanged": {
			steps: []step{
				rd(1, "d1", "rh", 10, 1, Aggregated),
				rd(1000, "d1", "rh", 1000, 2, Aggregated), // watermark 995; [0,60) closes
				rd(1001, "d1", "rh", 20, 3, TooLate),      // 60+600 <= 995
				rd(1002, "d1", "rh", 400, 4, Revised),     // window [360,420): 420+600 > 995
			},
			flush: true,
			want: []want{
				{dev: "d1", metric: "rh", start: 0, points: [][2]float64{{10, 1}}},
				{dev: "d1", metric: "rh", start: 360, late: 1, points: [][2]float64{{400, 4}}},
				{dev: "d1", metric: "rh", start: 960, points: [][2]float64{{1000, 2}}},
			},
		},
		"too far in the future is refused and does not move the watermark": {
			steps: []step{
				rd(1, "d1", "t", 10, 1, Aggregated),
				rd(2, "d1", "t", 122.5, 2, Future), // clock 2 + skew 120 < 122.5
				rd(3, "d1", "t", 20, 3, Aggregated),
			},
			flush: true,
			want:  []want{{dev: "d1", metric: "t", start: 0, points: [][2]float64{{10, 1}, {20, 3}}}},
		},
		"idle device's windows close on wall clock; a straggler then revises": {
			steps: []step{
				rd(1, "d1", "t", 1, 10, Aggregated),
				rd(2, "d1", "t", 2, 11, Aggregated),
				tick(91),                          // 89 s silent: still open
				tick(92),                          // 90 s silent: closes
				rd(93, "d1", "t", 3, 12, Revised), // same window, after idle close
				rd(94, "d1", "t", 93, 13, Aggregated),
			},
			flush: true,
			want: []want{
				{dev: "d1", metric: "t", start: 0, points: [][2]float64{{1, 10}, {2, 11}}},
				{dev: "d1", metric: "t", start: 0, revision: 1, late: 1, points: [][2]float64{{1, 10}, {2, 11}, {3, 12}}},
				{dev: "d1", metric: "t", start: 60, points: [][2]float64{{93, 13}}},
			},
		},
		"device replaying hours of buffer is on time by its own watermark": {
			cfg: func(c *Config) { c.MaxFutureSkew = time.Minute },
			steps: []step{
				rd(7200, "old", "t", 0, 1, Aggregated),
				rd(7200, "old", "t", 30, 2, Aggregated),
				rd(7200, "old", "t", 66, 3, Aggregated),
				rd(7200, "new", "t", 7199, 4, Aggregated),
			},
			flush: true,
			want: []want{
				{dev: "old", metric: "t", start: 0, points: [][2]float64{{0, 1}, {30, 2}}},
				{dev: "new", metric: "t", start: 7140, points: [][2]float64{{7199, 4}}},
				{dev: "old", metric: "t", start: 60, points: [][2]float64{{66, 3}}},
			},
		},
		"devices interleaved keep separate watermarks": {
			steps: []step{
				rd(1, "a", "t", 10, 1, Aggregated),
				rd(1, "b", "t", 11, 2, Aggregated),
				rd(2, "a", "t", 70, 3, Aggregated), // closes a's [0,60) only
				rd(2, "b", "t", 50, 4, Aggregated), // b's window is still open
				rd(3, "b", "t", 65, 5, Aggregated), // b's watermark 60: closes b's [0,60)
				rd(3, "a", "h", 20, 6, Revised),    // a new metric of a, behind a's watermark
			},
			flush: true,
			want: []want{
				{dev: "a", metric: "t", start: 0, points: [][2]float64{{10, 1}}},
				{dev: "b", metric: "t", start: 0, points: [][2]float64{{11, 2}, {50, 4}}},
				{dev: "a", metric: "h", start: 0, late: 1, points: [][2]float64{{20, 6}}},
				{dev: "a", metric: "t", start: 60, points: [][2]float64{{70, 3}}},
				{dev: "b", metric: "t", start: 60, points: [][2]float64{{65, 5}}},
			},
		},
		"epoch alignment for a 15 s window": {
			cfg: func(c *Config) { c.Window = 15 * time.Second; c.MaxOutOfOrder = 0 },
			steps: []step{
				rd(1, "d", "t", 14.999, 1, Aggregated),
				rd(1, "d", "t", 15, 2, Aggregated), // watermark 15 closes [0,15)
				rd(1, "d", "t", 44, 3, Aggregated), // closes [15,30)
			},
			flush: true,
			want: []want{
				{dev: "d", metric: "t", start: 0, points: [][2]float64{{14.999, 1}}},
				{dev: "d", metric: "t", start: 15, points: [][2]float64{{15, 2}}},
				{dev: "d", metric: "t", start: 30, points: [][2]float64{{44, 3}}},
			},
		},
		"retained state cap evicts oldest; its late readings are refused as evicted": {
			cfg: func(c *Config) { c.MaxRetained = 1 },
			steps: []step{
				rd(1, "d", "t", 10, 1, Aggregated),
				rd(1, "d", "t", 70, 2, Aggregated),    // closes [0,60): retained 1
				rd(130, "d", "t", 130, 3, Aggregated), // closes [60,120): evicts [0,60)
				rd(131, "d", "t", 20, 4, Evicted),
				rd(132, "d", "t", 80, 5, Revised),
			},
			want: []want{
				{dev: "d", metric: "t", start: 0, points: [][2]float64{{10, 1}}},
				{dev: "d", metric: "t", start: 60, points: [][2]float64{{70, 2}}},
				{dev: "d", metric: "t", start: 60, revision: 1, late: 1, points: [][2]float64{{70, 2}, {80, 5}}},
			},
		},
		"no lateness: anything behind the watermark is too late": {
			cfg: func(c *Config) { c.AllowedLateness = 0 },
			steps: []step{
				rd(1, "d", "t", 10, 1, Aggregated),
				rd(1, "d", "t", 70, 2, Aggregated),
				rd(1, "d", "t", 20, 3, TooLate),
			},
			want: []want{{dev: "d", metric: "t", start: 0, points: [][2]float64{{10, 1}}}},
		},
		"invalid readings are counted, not aggregated": {
			steps: []step{
				rd(1, "", "t", 10, 1, Invalid),
				rd(1, "d", "", 10, 1, Invalid),
				rd(1, "d", "t", 10, math.NaN(), Invalid),
				rd(1, "d", "t", 10, math.Inf(1), Invalid),
			},
			flush: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			clk := &clock{t: base}
			var got []Summary
			a, err := New(cfg, WallClock(clk.now), func(s Summary) { got = append(got, s) })
			if err != nil {
				t.Fatal(err)
			}
			var wantCounts [numOutcomes]uint64
			for i, s := range tc.steps {
				clk.t = sec(s.wall)
				if s.tick {
					a.Tick()
					continue
				}
				o := a.Add(Reading{Device: s.dev, Metric: s.metric, Time: sec(s.ev), Value: s.v})
				if o != s.want {
					t.Errorf("step %d (%s/%s at %v): outcome %v, want %v", i, s.dev, s.metric, s.ev, o, s.want)
				}
				wantCounts[s.want]++
			}
			if tc.flush {
				a.Flush()
			}
			if len(got) != len(tc.want) {
				for _, g := range got {
					t.Logf("got %s/%s %v rev %d n=%d", g.Device, g.Metric, g.WindowStart.Sub(base), g.Revision, g.Count)
				}
				t.Fatalf("%d summaries, want %d", len(got), len(tc.want))
			}
			// Summaries of different series may come in any order; within a
			// series they must come in window, then revision, order.
			used := make([]bool, len(got))
			for _, w := range tc.want {
				found := false
				for i, g := range got {
					if !used[i] && g.Device == w.dev && g.Metric == w.metric && g.WindowStart.Equal(sec(w.start)) && g.Revision == w.revision {
						checkSummary(t, g, w, cfg)
						used[i], found = true, true
						break
					}
				}
				if !found {
					t.Errorf("missing summary %s/%s@%v rev %d", w.dev, w.metric, w.start, w.revision)
				}
			}
			checkSeriesOrder(t, got)
			c := a.Counts()
			if c.Readings != wantCounts {
				t.Errorf("counts = %v, want %v", c.Readings, wantCounts)
			}
			if c.Total() != uint64(countReadings(tc.steps)) {
				t.Errorf("total %d, want %d readings", c.Total(), countReadings(tc.steps))
			}
		})
	}
}

func countReadings(steps []step) int {
	n := 0
	for _, s := range steps {
		if !s.tick {
			n++
		}
	}
	return n
}

// checkSeriesOrder asserts that each series' emissions are in (window,
// revision) order, except that a revision of an older window may follow a
// newer window's first emission (late data).
func checkSeriesOrder(t *testing.T, got []Summary) {
	t.Helper()
	type k struct{ d, m string }
	lastRev := map[string]int{}
	lastStart := map[k]time.Time{}
	for _, g := range got {
		id := fmt.Sprint(g.Device, g.Metric, g.WindowStart.UnixNano())
		if r, ok := lastRev[id]; ok && g.Revision != r+1 {
			t.Errorf("%s: revision %d after %d", id, g.Revision, r)
		}
		lastRev[id] = g.Revision
		key := k{g.Device, g.Metric}
		if g.Revision == 0 && g.Late == 0 {
			if prev, ok := lastStart[key]; ok && !g.WindowStart.After(prev) {
				t.Errorf("%v: window %v emitted after %v", key, g.WindowStart, prev)
			}
			lastStart[key] = g.WindowStart
		}
	}
}

func TestManyDevicesInterleaved(t *testing.T) {
	// 200 devices x 3 metrics, one reading per second each for 10 minutes,
	// arriving interleaved and up to 4 s out of order. Every window of every
	// series must come out exactly once, with the count the generator put in.
	cfg := testConfig()
	clk := &clock{t: base}
	type key struct {
		d, m  string
		start int64
	}
	got := map[key]Summary{}
	a, err := New(cfg, WallClock(clk.now), func(s Summary) {
		k := key{s.Device, s.Metric, s.WindowStart.Unix()}
		if _, dup := got[k]; dup {
			t.Errorf("window %v emitted twice", k)
		}
		got[k] = s
	})
	if err != nil {
		t.Fatal(err)
	}
	wantCount := map[key]int64{}
	wantSum := map[key]float64{}
	const devices, seconds = 200, 600
	metrics := []string{"t", "h", "p"}
	for s := 0; s < seconds; s++ {
		clk.t = sec(float64(s))
		for d := 0; d < devices; d++ {
			for mi, m := range metrics {
				ev := s - (d+mi+s)%5 // up to 4 s behind
				if ev < 0 {
					continue
				}
				dev := fmt.Sprintf("dev-%03d", d)
				v := float64(d*1000 + ev + mi)
				if o := a.Add(Reading{Device: dev, Metric: m, Time: sec(float64(ev)), Value: v}); o != Aggregated {
					t.Fatalf("reading %s/%s@%d: %v", dev, m, ev, o)
				}
				k := key{dev, m, base.Unix() + int64(ev/60*60)}
				wantCount[k]++
				wantSum[k] += v
			}
		}
		a.Tick()
	}
	a.Flush()
	if len(got) != len(wantCount) {
		t.Fatalf("%d windows, want %d", len(got), len(wantCount))
	}
	for k, n := range wantCount {
		s := got[k]
		if s.Count != n || s.Sum != wantSum[k] {
			t.Errorf("%v: count %d sum %g, want %d %g", k, s.Count, s.Sum, n, wantSum[k])
		}
	}
}

func TestRetainedExpiry(t *testing.T) {
	cfg := testConfig()
	cfg.AllowedLateness = 2 * time.Minute
	clk := &clock{t: base}
	a, _ := New(cfg, WallClock(clk.now), nil)
	for m := 0; m < 10; m++ {
		clk.t = sec(float64(m * 60))
		a.Add(Reading{Device: "d", Metric: "t", Time: sec(float64(m*60 + 1)), Value: 1})
		a.Tick()
	}
	// Watermark 541-5 = 536. Closed: the windows ending 60..480. Revisable
	// (end + 120 s > 536): those ending 420 and 480.
	if got, want := a.Retained(), 2; got != want {
		t.Errorf("retained %d, want %d", got, want)
	}
}

func TestSummaryIDDeterministic(t *testing.T) {
	a := SummaryID("gw", "d", "t", base, 0)
	if a != SummaryID("gw", "d", "t", base, 0) {
		t.Fatal("same inputs, different id")
	}
	for name, b := range map[string]string{
		"revision": SummaryID("gw", "d", "t", base, 1),
		"window":   SummaryID("gw", "d", "t", base.Add(time.Minute), 0),
		"boundary": SummaryID("gw", "dt", "", base, 0),
		"gateway":  SummaryID("gw2", "d", "t", base, 0),
	} {
		if a == b {
			t.Errorf("%s change kept id %s", name, a)
		}
	}
	if len(a) != 32 {
		t.Errorf("id %q is not 32 hex digits", a)
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	c.Window = 500 * time.Millisecond
	if err := c.Validate(); err == nil {
		t.Error("sub-second window accepted")
	}
}

// TestTickDue: a tick is due after readings, or when an open window has
// been idle for IdleClose; not otherwise, and a due tick that closes the
// idle windows leaves none due.
func TestTickDue(t *testing.T) {
	cfg := testConfig()
	clk := &clock{t: base}
	var emitted int
	a, err := New(cfg, WallClock(clk.now), func(Summary) { emitted++ })
	if err != nil {
		t.Fatal(err)
	}
	if a.TickDue(el(clk.t)) {
		t.Error("fresh aggregator: tick due")
	}
	a.Add(Reading{Device: "d", Metric: "m", Time: clk.t, Value: 1})
	if !a.TickDue(el(clk.t)) {
		t.Error("after a reading: no tick due")
	}
	a.Tick()
	if a.TickDue(el(clk.t)) || a.TickDue(el(clk.t.Add(cfg.IdleClose-time.Nanosecond))) {
		t.Error("tick due before the idle time")
	}
	if !a.TickDue(el(clk.t.Add(cfg.IdleClose))) {
		t.Error("open window idle for IdleClose: no tick due")
	}
	clk.t = clk.t.Add(cfg.IdleClose)
	a.Tick()
	if emitted != 1 || a.TickDue(el(clk.t.Add(time.Hour))) {
		t.Errorf("after the idle close: %d emitted, tick due %v; want 1, false", emitted, a.TickDue(el(clk.t.Add(time.Hour))))
	}
}

// el is the elapsed time WallClock reads at wall time t.
func el(t time.Time) time.Duration { return time.Duration(t.UnixNano()) }
