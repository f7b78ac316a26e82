package aggregate

import (
	"fmt"
	"math"
	"reflect"
	"runtime"
	"testing"
	"time"
)

// TestSeriesLimits: a reading that would make a series beyond
// MaxMetricsPerDevice, MaxSeries or MaxDevices ends as TooManySeries and
// makes nothing; series already there go on; once their windows close
// they are dropped and their names can be used again.
func TestSeriesLimits(t *testing.T) {
	cfg := testConfig()
	cfg.MaxMetricsPerDevice, cfg.MaxSeries, cfg.MaxDevices = 3, 5, 3
	clk := &clock{t: sec(1)}
	var sums []Summary
	a, err := New(cfg, WallClock(clk.now), func(s Summary) { sums = append(sums, s) })
	if err != nil {
		t.Fatal(err)
	}
	a.SetStore(mapStore{}) // as the gateway runs: closed windows leave RAM
	add := func(dev, metric string, ev float64) Outcome {
		return a.Add(Reading{Device: dev, Metric: metric, Time: sec(ev), Value: 1})
	}
	var got []string
	for _, r := range []struct {
		dev, metric string
	}{
		{"a", "m1"}, {"a", "m2"}, {"a", "m3"}, {"a", "m4"}, // the fourth metric of a: per device
		{"a", "m1"},              // an existing series goes on
		{"b", "m1"}, {"b", "m2"}, // five series in all
		{"b", "m3"}, // over max_series
		{"c", "m1"}, // a new device, but no series left
	} {
		got = append(got, fmt.Sprintf("%s/%s:%s", r.dev, r.metric, add(r.dev, r.metric, 1)))
	}
	want := []string{"a/m1:aggregated", "a/m2:aggregated", "a/m3:aggregated", "a/m4:too_many_series",
		"a/m1:aggregated", "b/m1:aggregated", "b/m2:aggregated", "b/m3:too_many_series", "c/m1:too_many_series"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("outcomes\n got %v\nwant %v", got, want)
	}
	c := a.Counts()
	if c.Of(TooManySeries) != 3 || c.Of(Aggregated) != 6 || a.Series() != 5 || a.Devices() != 2 {
		t.Errorf("counts %v, %d series, %d devices; want 3 too_many_series, 6 aggregated, 5 series, 2 devices",
			c.Readings, a.Series(), a.Devices())
	}
	// A refused reading changes nothing, not even its device's watermark.
	if o := add("a", "m4", 70); o != TooManySeries || len(sums) != 0 {
		t.Errorf("a/m4 at 70 s: %s with %d summaries, want too_many_series and none", o, len(sums))
	}
	// a's watermark passes its window: its three series close and are
	// dropped (a/m1 is made again for its new window), so a can use other
	// names, and c is let in.
	if o := add("a", "m1", 70); o != Aggregated {
		t.Errorf("a/m1 at 70 s: %s", o)
	}
	if len(sums) != 3 || a.Series() != 3 {
		t.Errorf("%d summaries, %d series; want 3 (a's windows) and 3 (a/m1, b/m1, b/m2)", len(sums), a.Series())
	}
	if o := add("a", "m4", 70); o != Aggregated {
		t.Errorf("a/m4 after a's windows closed: %s, want aggregated", o)
	}
	if o := add("c", "m1", 70); o != Aggregated {
		t.Errorf("device c with a series free: %s", o)
	}
	if o := add("d", "m1", 70); o != TooManySeries {
		t.Errorf("a fourth device: %s, want too_many_series", o)
	}
}

// TestClosedSeriesCostNothing: once a series' windows close it is no
// longer held in RAM (with a Store, as the gateway runs), and a late
// reading still revises its window exactly, through the store, also after
// a snapshot and restore.
func TestClosedSeriesCostNothing(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRetained = 1
	cfg.MaxSeries, cfg.MaxMetricsPerDevice = 0, 0
	clk := &clock{t: sec(1)}
	var sums []Summary
	a, _ := New(cfg, WallClock(clk.now), func(s Summary) { sums = append(sums, s) })
	st := mapStore{}
	a.SetStore(st)
	const n = 1000
	for i := range n {
		a.Add(Reading{Device: "d", Metric: fmt.Sprintf("m%d", i), Time: sec(1), Value: float64(i)})
	}
	if a.Series() != n {
		t.Fatalf("%d series, want %d", a.Series(), n)
	}
	// One reading of another metric a minute later closes every window.
	clk.t = sec(70)
	a.Add(Reading{Device: "d", Metric: "x", Time: sec(70), Value: 1})
	st.checkpoint(a)
	if len(sums) != n || a.Series() != 1 || len(a.devices["d"].series) != 1 {
		t.Fatalf("%d summaries, %d series in RAM; want %d and 1", len(sums), a.Series(), n)
	}
	b, _ := New(cfg, WallClock(clk.now), func(s Summary) { sums = append(sums, s) })
	if err := b.Restore(a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	b.SetStore(st)
	for _, agg := range []*Aggregator{a, b} {
		sums = sums[:0]
		if o := agg.Add(Reading{Device: "d", Metric: "m7", Time: sec(30), Value: 100}); o != Revised {
			t.Fatalf("late reading: %s, want late_revised", o)
		}
		if len(sums) != 1 || sums[0].Revision != 1 || sums[0].Count != 2 || sums[0].Sum != 107 || sums[0].Late != 1 {
			t.Errorf("revision %+v, want revision 1 of 2 readings summing to 107", sums)
		}
	}
}

// BenchmarkHeapPerSeries reports the heap that a million series of one
// reading each hold once their windows have closed.
func BenchmarkHeapPerSeries(b *testing.B) {
	cfg := testConfig()
	cfg.MaxSeries, cfg.MaxMetricsPerDevice, cfg.MaxDevices = 0, 0, 0
	cfg.MaxRetained = 1000 // the RAM cache of closed windows is bounded on its own
	const devices, metrics = 1000, 1000
	for range b.N {
		clk := &clock{t: sec(1)}
		a, _ := New(cfg, WallClock(clk.now), nil)
		a.SetStore(mapStore{})
		before := heapInUse()
		for d := range devices {
			dev := fmt.Sprintf("dev-%d", d)
			for m := range metrics {
				a.Add(Reading{Device: dev, Metric: fmt.Sprintf("metric-%d", m), Time: sec(1), Value: 1})
			}
		}
		open := heapInUse()
		clk.t = sec(70)
		for d := range devices {
			a.Add(Reading{Device: fmt.Sprintf("dev-%d", d), Metric: "metric-0", Time: sec(70), Value: 1})
		}
		a.TakeDirty(func(string, string, WindowState) {}) // as a checkpoint does
		a.Tick()
		closed := heapInUse()
		b.ReportMetric(float64(open-before)/(devices*metrics), "bytes/series-open")
		b.ReportMetric(float64(closed-before)/(devices*metrics), "bytes/series-closed")
		keep(a)
	}
}

var kept *Aggregator

func keep(a *Aggregator) { kept = a }

func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestForget: a forgotten device's open windows are emitted, it no longer
// counts against MaxDevices, Horizons reports it once so that its stored
// windows go, and a later reading makes it again.
func TestForget(t *testing.T) {
	var out []Summary
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	clk := &stepClock{wall: at, elapsed: time.Hour, synced: true}
	cfg := testConfig()
	cfg.MaxDevices = 2
	a, err := New(cfg, clk, func(s Summary) { out = append(out, s) })
	if err != nil {
		t.Fatal(err)
	}
	add := func(dev string) Outcome { return a.Add(Reading{Device: dev, Metric: "m", Time: at, Value: 1}) }
	if add("a") != Aggregated || add("b") != Aggregated || add("c") != TooManySeries {
		t.Fatal("MaxDevices not reached")
	}
	if !a.Forget("a") || a.Forget("a") || len(out) != 1 || out[0].Device != "a" || a.Devices() != 1 || a.Series() != 1 {
		t.Fatalf("after Forget: %d summaries, %d devices, %d series", len(out), a.Devices(), a.Series())
	}
	if add("c") != Aggregated {
		t.Fatal("the forgotten device's place not free")
	}
	var reported []string
	a.Horizons(func(dev string, before int64) {
		if before == math.MaxInt64 {
			reported = append(reported, dev)
		}
	})
	a.Horizons(func(dev string, before int64) {
		if before == math.MaxInt64 {
			t.Errorf("%s reported twice", dev)
		}
	})
	if len(reported) != 1 || reported[0] != "a" {
		t.Errorf("Horizons reported %v forgotten", reported)
	}
	a.Tick() // expire meets the forgotten device's retained window
}

// TestHas: what Add's series limits count, as a caller holding readings
// back sees it.
func TestHas(t *testing.T) {
	cfg := testConfig()
	cfg.MaxMetricsPerDevice, cfg.MaxSeries, cfg.MaxDevices = 3, 5, 4
	clk := &clock{t: sec(1)}
	a, err := New(cfg, WallClock(clk.now), func(Summary) {})
	if err != nil {
		t.Fatal(err)
	}
	a.Add(Reading{Device: "a", Metric: "m1", Time: sec(1), Value: 1})
	a.Add(Reading{Device: "a", Metric: "m2", Time: sec(1), Value: 1})
	for _, c := range []struct {
		dev, metric   string
		series, known bool
		metrics       int
	}{{"a", "m1", true, true, 2}, {"a", "m3", false, true, 2}, {"b", "m1", false, false, 0}} {
		if s, k, m := a.Has(c.dev, c.metric); s != c.series || k != c.known || m != c.metrics {
			t.Errorf("Has(%s, %s) = %v, %v, %d; want %v, %v, %d", c.dev, c.metric, s, k, m, c.series, c.known, c.metrics)
		}
	}
	if s, d, m := a.Limits(); s != 5 || d != 4 || m != 3 {
		t.Errorf("Limits() = %d, %d, %d", s, d, m)
	}
}
