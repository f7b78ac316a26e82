package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/gateway"
)

// at0 is a minute's start, so that samples fall in known minutes.
var at0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// fakeStatus is a status at t with n readings aggregated by each device
// (its id and count) and the forwarder's link up.
func fakeStatus(t time.Time, devices map[string]uint64) status {
	st := status{Now: t, Started: at0, MQTT: gateway.Stats{Outcomes: map[string]uint64{}, DeadLetters: map[string]uint64{}},
		Kafka: bridge.Stats{Link: bridge.LinkUp, LinkUp: true, LinkSince: at0}}
	for _, id := range []string{"dev-a", "dev-b"} {
		if n, ok := devices[id]; ok {
			st.MQTT.DeviceList = append(st.MQTT.DeviceList, aggregate.DeviceStat{ID: id, Aggregated: n})
			st.MQTT.Outcomes["aggregated"] += n
		}
	}
	return st
}

// TestReadingsPerMinuteKnownRate: a device that sends 90 readings a minute
// (1.5 a second) shows 90.0, taken over the last minute; a second device
// at 6 a minute shows 6.0. In the first minute the figure is over the time
// since start, and says so; before 10 s there is none. (The old page
// showed "–" until two of its own polls had passed, and a count since its
// first poll after that.)
func TestReadingsPerMinuteKnownRate(t *testing.T) {
	h := newHistory()
	count := func(d time.Duration) map[string]uint64 {
		s := uint64(d / time.Second)
		return map[string]uint64{"dev-a": s * 3 / 2, "dev-b": s / 10}
	}
	for d := time.Duration(0); d <= 70*time.Second; d += historyStep {
		h.add(fakeStatus(at0.Add(d), count(d)))
	}
	now := 75 * time.Second
	f := computeFigures(fakeStatus(at0.Add(now), count(now)), h)
	a, b := f.Devices["dev-a"], f.Devices["dev-b"]
	if a.ReadingsPerMin == nil || b.ReadingsPerMin == nil {
		t.Fatalf("no figures at 75 s: %+v", f.Devices)
	}
	// Taken against the sample at 10 s: (112-15) readings in 65 s; 7 in 65 s.
	wantA, wantB := float64(112-15)/65*60, float64(7-1)/65*60
	if math.Abs(*a.ReadingsPerMin-wantA) > 1e-9 || math.Abs(*b.ReadingsPerMin-wantB) > 1e-9 || a.OverSeconds != 65 {
		t.Errorf("readings/min %v over %v s and %v; want %v over 65 s and %v", *a.ReadingsPerMin, a.OverSeconds, *b.ReadingsPerMin, wantA, wantB)
	}
	if a.Text != "89.5" || f.Rates.Over != "last minute" {
		t.Errorf("text %q over %q; want 89.5 over the last minute", a.Text, f.Rates.Over)
	}

	// At exactly the sampled rate, on the sampled instants: 90 and 6.
	f = computeFigures(fakeStatus(at0.Add(70*time.Second), count(70*time.Second)), h)
	if got := *f.Devices["dev-a"].ReadingsPerMin; got != 90 {
		t.Errorf("dev-a at 70 s: %v readings/min, want 90", got)
	}
	if got := *f.Devices["dev-b"].ReadingsPerMin; got != 6 {
		t.Errorf("dev-b at 70 s: %v readings/min, want 6", got)
	}

	// The first minute: over the time since start, and labelled.
	h = newHistory()
	h.add(fakeStatus(at0, count(0)))
	f = computeFigures(fakeStatus(at0.Add(5*time.Second), count(5*time.Second)), h)
	if _, ok := f.Devices["dev-a"]; ok || f.Rates.OverSeconds != 0 {
		t.Errorf("a figure at 5 s: %+v, rates %+v", f.Devices["dev-a"], f.Rates)
	}
	h.add(fakeStatus(at0.Add(10*time.Second), count(10*time.Second)))
	f = computeFigures(fakeStatus(at0.Add(20*time.Second), count(20*time.Second)), h)
	if d := f.Devices["dev-a"]; d.ReadingsPerMin == nil || *d.ReadingsPerMin != 90 || d.Text != "90.0 (over the first 20 s)" {
		t.Errorf("at 20 s: %+v", d)
	}
}

// TestDrainStates: each drain state from the inputs that make it, with the
// ETA at the last minute's delivery rate.
func TestDrainStates(t *testing.T) {
	h := newHistory()
	st := fakeStatus(at0, nil)
	h.add(st)
	cases := []struct {
		name      string
		edit      func(*status)
		state     string
		eta       float64 // the metric
		textStart string
	}{
		{"empty", func(s *status) {}, drainEmpty, 0, "empty at 0.0 records/s (last minute)"},
		{"draining", func(s *status) { s.Kafka.Delivered, s.Kafka.Queued = 120, 300 }, drainDraining, 150, "about 2 min at 2.0 records/s (last minute)"},
		{"waiting", func(s *status) { s.Kafka.Queued, s.Kafka.OldestAge = 5, 20*time.Second }, drainWaiting, math.NaN(), "waiting: 5 records queued, the oldest 20 s ago"},
		{"stalled", func(s *status) { s.Kafka.Queued, s.Kafka.OldestAge = 5, 90*time.Second }, drainStuck, math.Inf(1), "not draining: nothing delivered for a minute"},
		{"link down", func(s *status) {
			s.Kafka.Delivered, s.Kafka.Queued, s.Kafka.OldestAge = 120, 300, 5*time.Second
			s.Kafka.Link, s.Kafka.LinkUp, s.Kafka.LinkError = bridge.LinkDown, false, "connect to kafka: refused"
		}, drainStuck, math.Inf(1), "not draining: the link is down; 300 records wait"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fakeStatus(at0.Add(time.Minute), nil)
			c.edit(&s)
			d := computeFigures(s, h).Drain
			eta := d.etaMetric()
			sameETA := eta == c.eta || math.IsNaN(eta) && math.IsNaN(c.eta)
			// The card's short ETA: 150 s is 2.5 min, written "2 min" as
			// the text beside it has it (a tie rounds to even).
			wantShort := c.state
			if c.state == drainDraining {
				wantShort = "2 min"
			}
			if d.ETA != wantShort {
				t.Errorf("short ETA %q, want %q", d.ETA, wantShort)
			}
			if d.State != c.state || !sameETA || !strings.HasPrefix(d.Text, c.textStart) {
				t.Errorf("drain %q, ETA metric %v, %q; want %q, %v, %q…", d.State, eta, d.Text, c.state, c.eta, c.textStart)
			}
		})
	}
}

// TestHistoryView: the charts' data from known samples: rates over each
// step, dead letters by reason by minute (the current minute included),
// and devices by whole minute only (none before start, not the current
// one).
func TestHistoryView(t *testing.T) {
	h := newHistory()
	start := at0.Add(30 * time.Second) // half a minute into 10:00
	for i := range 10 {                // 10:00:30 to 10:02:00
		st := fakeStatus(start.Add(time.Duration(i)*historyStep), map[string]uint64{"dev-a": uint64(i * 20)})
		st.MQTT.Summaries, st.Kafka.Delivered = uint64(i*5), uint64(i*4)
		st.Kafka.Queued = uint64(i)
		if i >= 3 { // 10:01:00 on: one invalid_json every step
			st.MQTT.DeadLetters["invalid_json"] = uint64(i - 2)
		}
		h.add(st)
	}
	v := h.view(start.Add(95 * time.Second)) // 10:02:05
	if len(v.Points) != 9 || v.Points[0].ReadingsPerS != 2 || v.Points[0].SummariesPerS != 0.5 || v.Points[0].DeliveredPerS != 0.4 || v.Points[8].Queued != 9 {
		t.Fatalf("points %+v", v.Points)
	}
	// Minutes: at least five, the last the current one (10:02).
	if len(v.Minutes) != 5 || !v.Minutes[4].Equal(at0.Add(2*time.Minute)) {
		t.Fatalf("minutes %v", v.Minutes)
	}
	// invalid_json: the samples at 10:01:00..10:01:50 count 1..6, at
	// 10:02:00 7. A sample counts what came before it: the one at
	// 10:01:00 came in 10:00 (1), those up to 10:02:00 in 10:01 (7-1),
	// none yet in 10:02.
	if got := v.DeadLetters["invalid_json"]; len(got) != 5 || got[2] != 1 || got[3] != 6 || got[4] != 0 {
		t.Errorf("dead letters by minute %v, want [0 0 1 6 0]", got)
	}
	// Whole minutes covered: 10:01 only (10:00 began before the first
	// sample, 10:02 is not over): dev-a's 20 readings a step, 6 steps.
	if len(v.DeviceMinutes) != 1 || !v.DeviceMinutes[0].Equal(at0.Add(time.Minute)) || len(v.Devices["dev-a"]) != 1 || v.Devices["dev-a"][0] != 120 {
		t.Errorf("device minutes %v, dev-a %v", v.DeviceMinutes, v.Devices["dev-a"])
	}
}

// TestHistoryBounded: an hour of samples at most, and the first
// maxDeviceMetrics devices.
func TestHistoryBounded(t *testing.T) {
	h := newHistory()
	for i := range historyLen + 50 {
		st := fakeStatus(at0.Add(time.Duration(i)*historyStep), nil)
		for d := range maxDeviceMetrics + 20 {
			st.MQTT.DeviceList = append(st.MQTT.DeviceList, aggregate.DeviceStat{ID: "d" + string(rune('a'+d%26)) + string(rune('a'+d/26)), Aggregated: uint64(i)})
		}
		h.add(st)
	}
	if len(h.samples) != historyLen || len(h.devices) != maxDeviceMetrics || len(h.samples[0].devices) != maxDeviceMetrics {
		t.Errorf("%d samples, %d devices; want %d and %d", len(h.samples), len(h.devices), historyLen, maxDeviceMetrics)
	}
	if !h.samples[0].at.Equal(at0.Add(50 * historyStep)) {
		t.Errorf("oldest sample at %v", h.samples[0].at)
	}
}

// TestFiguresOnTheMonotonicClock: the figures take time by the monotonic
// clock, so a step of the wall clock (NTP's first answer on a gateway
// without a real-time clock) leaves the rates right; and a history whose
// samples carry wall times alone (one 90 days before the rest) still
// spans an hour at most.
func TestFiguresOnTheMonotonicClock(t *testing.T) {
	h := newHistory()
	began := time.Now()
	st := fakeStatus(at0, map[string]uint64{"dev-a": 0})
	st.mono = began.Add(-30 * time.Second) // 30 s ago on the monotonic clock
	h.add(st)
	st = fakeStatus(at0.Add(90*24*time.Hour), map[string]uint64{"dev-a": 45}) // the wall clock stepped 90 days
	st.mono = began
	f := computeFigures(st, h)
	if d := f.Devices["dev-a"]; d.ReadingsPerMin == nil || math.Abs(*d.ReadingsPerMin-90) > 1e-6 || math.Abs(d.OverSeconds-30) > 1e-6 {
		t.Errorf("after a 90-day step: %+v; want 90 readings/min over 30 s", d)
	}

	h = newHistory()
	h.add(fakeStatus(at0.Add(-90*24*time.Hour), nil))
	for i := range 6 {
		h.add(fakeStatus(at0.Add(time.Duration(i)*historyStep), nil))
	}
	v := h.view(at0.Add(time.Minute))
	if len(v.Minutes) > 61 {
		t.Errorf("%d minutes in the view; want an hour's at most", len(v.Minutes))
	}
}
