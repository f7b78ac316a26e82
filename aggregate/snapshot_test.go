package aggregate

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// event is one step of a generated stream: a reading or a tick, at a wall
// time.
type event struct {
	wall time.Time
	tick bool
	r    Reading
}

// stream generates readings from several devices with jitter, out-of-order
// and late arrivals, silences that trigger idle closing, and units.
func stream(seed uint64, n int) []event {
	rng := rand.New(rand.NewPCG(seed, 1))
	var evs []event
	wall := base
	for i := 0; i < n; i++ {
		wall = wall.Add(time.Duration(rng.IntN(900)) * time.Millisecond)
		if rng.IntN(10) == 0 {
			evs = append(evs, event{wall: wall, tick: true})
			continue
		}
		dev := fmt.Sprintf("d%d", rng.IntN(4))
		lag := time.Duration(rng.IntN(8)) * time.Second // mostly within max_out_of_order
		if rng.IntN(15) == 0 {
			lag = time.Duration(rng.IntN(600)) * time.Second // late: a revision, or too late
		}
		if dev == "d3" && rng.IntN(3) == 0 {
			wall = wall.Add(100 * time.Second) // silences: idle close
		}
		unit := ""
		if rng.IntN(2) == 0 {
			unit = "Cel"
		}
		evs = append(evs, event{wall: wall, r: Reading{Device: dev, Metric: []string{"t", "h"}[rng.IntN(2)], Unit: unit,
			Time: wall.Add(-lag), Value: float64(rng.IntN(1000)) / 10}})
	}
	return evs
}

func runEvents(t *testing.T, a *Aggregator, clk *clock, evs []event) {
	t.Helper()
	for _, e := range evs {
		clk.t = e.wall
		if e.tick {
			a.Tick()
		} else {
			a.Add(e.r)
		}
	}
}

// TestSnapshotRestoreContinues checks, for many streams and split points,
// that an aggregator restored from a snapshot and fed the rest of the
// stream emits exactly what an uninterrupted one does, and ends with the
// same counters.
func TestSnapshotRestoreContinues(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRetained = 40 // exercise eviction across the snapshot too
	for seed := uint64(1); seed <= 30; seed++ {
		evs := stream(seed, 600)
		split := int(seed*37) % len(evs)

		clkA := &clock{}
		var whole []Summary
		a, _ := New(cfg, WallClock(clkA.now), func(s Summary) { whole = append(whole, s) })
		runEvents(t, a, clkA, evs)
		a.Flush()

		clkB := &clock{}
		var parts []Summary
		b, _ := New(cfg, WallClock(clkB.now), func(s Summary) { parts = append(parts, s) })
		runEvents(t, b, clkB, evs[:split])
		snap := b.Snapshot()

		c, _ := New(cfg, WallClock(clkB.now), func(s Summary) { parts = append(parts, s) })
		if err := c.Restore(snap); err != nil {
			t.Fatalf("seed %d: Restore: %v", seed, err)
		}
		runEvents(t, c, clkB, evs[split:])
		c.Flush()

		if fmt.Sprint(whole) != fmt.Sprint(parts) {
			t.Fatalf("seed %d split %d: emissions differ: %d uninterrupted, %d across a restore", seed, split, len(whole), len(parts))
		}
		if a.Counts() != c.Counts() {
			t.Fatalf("seed %d: counts %+v, across a restore %+v", seed, a.Counts(), c.Counts())
		}
		if len(whole) < 50 {
			t.Fatalf("seed %d: only %d summaries: the stream is too tame to test anything", seed, len(whole))
		}
	}
}

// TestRestoreRefusesDamage truncates and corrupts a snapshot: Restore must
// return ErrSnapshot (never panic) and leave the aggregator as it was.
func TestRestoreRefusesDamage(t *testing.T) {
	cfg := testConfig()
	clk := &clock{}
	a, _ := New(cfg, WallClock(clk.now), nil)
	runEvents(t, a, clk, stream(7, 300))
	snap := a.Snapshot()
	for cut := 0; cut < len(snap); cut++ {
		b, _ := New(cfg, WallClock(clk.now), nil)
		if err := b.Restore(snap[:cut]); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("snapshot cut at %d of %d: err %v", cut, len(snap), err)
		}
		if b.Devices() != 0 {
			t.Fatalf("failed Restore changed the aggregator")
		}
	}
	other := cfg
	other.Window = 2 * time.Minute
	b, _ := New(other, WallClock(clk.now), nil)
	if err := b.Restore(snap); !errors.Is(err, ErrSnapshot) {
		t.Errorf("snapshot from a 1m window restored into a 2m one: %v", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		bad := append([]byte(nil), snap...)
		bad[rng.IntN(len(bad))] ^= byte(1 + rng.IntN(255))
		c, _ := New(cfg, WallClock(clk.now), nil)
		_ = c.Restore(bad) // may succeed with different numbers; must not panic
	}
}
