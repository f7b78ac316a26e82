package aggregate

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// mapStore is a Store in a map, written the way the gateway writes its
// on-disk store: dirty windows and deletions at each checkpoint.
type mapStore map[string]WindowState

func storeKey(dev, metric string, start int64) string {
	return fmt.Sprintf("%s\x00%s\x00%d", dev, metric, start)
}

func (m mapStore) Load(dev, metric string, start int64) (WindowState, bool, error) {
	w, ok := m[storeKey(dev, metric, start)]
	return w, ok, nil
}

// checkpoint stores the dirty windows and deletes those past the horizons.
func (m mapStore) checkpoint(a *Aggregator) {
	a.TakeDirty(func(dev, metric string, w WindowState) { m[storeKey(dev, metric, w.Start)] = w })
	horizon := map[string]int64{}
	a.Horizons(func(dev string, before int64) { horizon[dev] = before })
	for k, w := range m {
		dev, _, _ := strings.Cut(k, "\x00")
		if h, ok := horizon[dev]; ok && w.Start < h {
			delete(m, k)
		}
	}
}

// TestStoreKeepsRevisionsExact feeds the same readings, many of them late
// (up to the allowed lateness and beyond), to an aggregator that keeps
// every closed window in RAM and to one that keeps only 3 in RAM and the
// rest in a store, checkpointed every 50 readings; and, from every tenth
// checkpoint on, to a third aggregator restored from that checkpoint's
// snapshot and store, as after a crash. All must emit the same summaries
// and outcomes.
func TestStoreKeepsRevisionsExact(t *testing.T) {
	cfg := testConfig()
	type emitted struct {
		outcomes []Outcome
		sums     []Summary
	}
	run := func(a *Aggregator, out *emitted, clk *clock, r Reading, wall time.Time) {
		clk.t = wall
		out.outcomes = append(out.outcomes, a.Add(r))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var readings []Reading
	var walls []time.Time
	for i := range 6000 {
		ev := base.Add(time.Duration(i) * time.Second / 4) // 4 readings per second of event time
		wall := ev.Add(time.Second)
		switch rng.IntN(10) {
		case 0:
			ev = ev.Add(-time.Duration(rng.IntN(9*60)) * time.Second) // late, within the lateness
		case 1:
			ev = ev.Add(-time.Duration(10*60+rng.IntN(60)) * time.Second) // too late, or nearly
		}
		readings = append(readings, Reading{Device: fmt.Sprintf("d%d", i%5), Metric: []string{"t", "h"}[i%2], Time: ev, Value: float64(rng.IntN(1000)) / 4})
		walls = append(walls, wall)
	}

	var ram, stored emitted
	ramClk, storeClk := &clock{}, &clock{}
	ramAgg, _ := New(cfg, WallClock(ramClk.now), func(s Summary) { ram.sums = append(ram.sums, s) })
	small := cfg
	small.MaxRetained = 3
	storeAgg, _ := New(small, WallClock(storeClk.now), func(s Summary) { stored.sums = append(stored.sums, s) })
	st := mapStore{}
	storeAgg.SetStore(st)
	type cp struct {
		at    int
		snap  []byte
		store mapStore
		sums  int
	}
	var cps []cp
	for i, r := range readings {
		run(ramAgg, &ram, ramClk, r, walls[i])
		run(storeAgg, &stored, storeClk, r, walls[i])
		if i%50 == 49 {
			ramAgg.Tick()
			storeAgg.Tick()
			st.checkpoint(storeAgg)
			if i%500 == 499 && i+1 < len(readings) {
				cps = append(cps, cp{i + 1, storeAgg.Snapshot(), maps.Clone(st), len(stored.sums)})
			}
		}
	}
	if !reflect.DeepEqual(ram.outcomes, stored.outcomes) {
		t.Fatal("outcomes differ between RAM and store")
	}
	if !reflect.DeepEqual(ram.sums, stored.sums) {
		t.Fatalf("summaries differ between RAM (%d) and store (%d)", len(ram.sums), len(stored.sums))
	}
	counts := ramAgg.Counts()
	if counts.Of(Revised) < 300 || counts.Of(TooLate) < 100 {
		t.Fatalf("too few late readings to test anything: %d revised, %d too late", counts.Of(Revised), counts.Of(TooLate))
	}
	if storeAgg.Retained() > 3+50 {
		t.Errorf("%d windows in RAM with a cache of 3", storeAgg.Retained())
	}

	// Restart from each kept checkpoint and replay what followed.
	for _, c := range cps {
		var got emitted
		clk := &clock{}
		a, _ := New(small, WallClock(clk.now), func(s Summary) { got.sums = append(got.sums, s) })
		if err := a.Restore(c.snap); err != nil {
			t.Fatal(err)
		}
		st := c.store
		a.SetStore(st)
		for i := c.at; i < len(readings); i++ {
			run(a, &got, clk, readings[i], walls[i])
			if i%50 == 49 {
				a.Tick()
				st.checkpoint(a)
			}
		}
		if !reflect.DeepEqual(got.sums, stored.sums[c.sums:]) {
			t.Errorf("restored at reading %d: summaries differ from the uninterrupted run", c.at)
		}
	}
}
