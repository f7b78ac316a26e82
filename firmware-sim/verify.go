package firmwaresim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// This file computes the summaries a truth log implies and compares them
// with what a consumer read from Kafka. It shares no code with the
// gateway's aggregator: the point is to check it.

// Rules are the gateway's windowing settings the expectation depends on.
type Rules struct {
	Window          time.Duration // tumbling, aligned to the Unix epoch
	MaxOutOfOrder   time.Duration // watermark = latest event time − this
	AllowedLateness time.Duration // behind the watermark by more: dead letter
	MaxFutureSkew   time.Duration // ahead of arrival by more: dead letter
	// TimeFloor: a device time before it is a clock that was never set.
	// Such a reading is stamped on arrival (UntrustedDeviceTime
	// "arrival", while the gateway's clock is synchronized) or a dead
	// letter ("deadletter").
	TimeFloor           time.Time
	UntrustedDeviceTime string
}

// DefaultTimeFloor is the gateway's floor at the least: it takes a year
// before its build, and never before 2025-01-01. A scenario's times are far
// from both (1970, or days from now).
var DefaultTimeFloor = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultRules are the gateway's defaults.
func DefaultRules() Rules {
	return Rules{Window: time.Minute, MaxOutOfOrder: 5 * time.Second, AllowedLateness: 24 * time.Hour, MaxFutureSkew: 2 * time.Minute,
		TimeFloor: DefaultTimeFloor, UntrustedDeviceTime: "arrival"}
}

// Found is a summary as read from Kafka, decoded on its own terms.
type Found struct {
	ID          string    `json:"id"`
	Gateway     string    `json:"gateway"`
	Device      string    `json:"device"`
	Metric      string    `json:"metric"`
	Unit        string    `json:"unit"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	Count       int64     `json:"count"`
	Min         float64   `json:"min"`
	Max         float64   `json:"max"`
	Sum         float64   `json:"sum"`
	Mean        float64   `json:"mean"`
	First       float64   `json:"first"`
	Last        float64   `json:"last"`
	Stddev      float64   `json:"stddev"`
	Revision    int       `json:"revision"`
	Late        int64     `json:"late"`
	// Where its readings' times came from (empty from older gateways).
	TimeSource     string `json:"time_source"`
	TimeReplaced   int64  `json:"time_replaced"`
	TimeRebased    int64  `json:"time_rebased"`
	TimeUnverified int64  `json:"time_unverified"`
	// Where it was read: records are compared in this order.
	Partition int32 `json:"-"`
	Offset    int64 `json:"-"`
}

// WindowKey names one window of one metric of one device.
type WindowKey struct {
	Device, Metric string
	Start          time.Time
}

func (k WindowKey) String() string {
	return fmt.Sprintf("%s/%s@%s", k.Device, k.Metric, k.Start.UTC().Format(time.RFC3339))
}

// expectedWindow accumulates the readings of one window.
type expectedWindow struct {
	unit          string
	values        []float64
	first, last   float64
	firstT, lastT time.Time
	// gateway: readings the gateway stamps (bare ones, and those of a
	// clock never set); replaced: of them, those of a clock never set.
	gateway, replaced int
}

func (w *expectedWindow) add(t time.Time, v float64, unit string) {
	if len(w.values) == 0 || t.Before(w.firstT) { // ties keep the earlier arrival
		w.firstT, w.first = t, v
	}
	if len(w.values) == 0 || !t.Before(w.lastT) { // ties take the later arrival
		w.lastT, w.last = t, v
	}
	w.values = append(w.values, v)
	if unit != "" {
		w.unit = unit
	}
}

// DeviceReport counts one device's comparison (or all of them).
type DeviceReport struct {
	Readings   int // counted readings in the truth log
	Expected   int // windows
	Found      int // windows found (highest revision)
	Missing    int
	Unexpected int
	Differ     int // windows whose fields differ
	Duplicates int // summary ids read more than once
	Order      int // order violations (see Verify)
	Ambiguous  int // windows not compared: a reading's window or fate depends on an arrival time the log cannot pin down
	Dropped    int // readings expected as dead letters (too late, too far ahead)
	Malformed  int // publications the gateway must refuse: malformed, or Sparkplug data by an alias it cannot know
	Uncounted  int // QoS 1/2 readings not acknowledged (their fate is unknown)
}

func (a *DeviceReport) add(b DeviceReport) {
	a.Readings += b.Readings
	a.Expected += b.Expected
	a.Found += b.Found
	a.Missing += b.Missing
	a.Unexpected += b.Unexpected
	a.Differ += b.Differ
	a.Duplicates += b.Duplicates
	a.Order += b.Order
	a.Ambiguous += b.Ambiguous
	a.Dropped += b.Dropped
	a.Malformed += b.Malformed
	a.Uncounted += b.Uncounted
}

// Report is the outcome of Verify.
type Report struct {
	Devices map[string]*DeviceReport
	Total   DeviceReport
	// Problems describes each mismatch, in a stable order.
	Problems []string
}

// OK reports whether the summaries match the truth exactly.
func (r *Report) OK() bool {
	t := r.Total
	return t.Missing == 0 && t.Unexpected == 0 && t.Differ == 0 && t.Duplicates == 0 && t.Order == 0
}

func (r *Report) dev(id string) *DeviceReport {
	d := r.Devices[id]
	if d == nil {
		d = &DeviceReport{}
		r.Devices[id] = d
	}
	return d
}

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify compares the summaries read from Kafka (found, in the order
// read) with the ones the truth log implies, per device:
//
//   - a window is expected when a counted reading (Sent.Counted) falls in
//     it and the gateway's rules accept it; its expected fields are
//     computed from the readings; the found window is its highest
//     revision; count must be equal, the other fields equal to 1e-9
//     (stddev 1e-6), relative;
//   - a reading the device stamped before Rules.TimeFloor (its clock
//     never set) is stamped on arrival, as a bare one is, or is a dead
//     letter (UntrustedDeviceTime "deadletter"); the found window's
//     time_source (device, gateway, mixed) and time_replaced must say so;
//   - a duplicate is a summary id read twice;
//   - an order violation is a device's summaries on more than one
//     partition, a revision read after a higher one of its window, or a
//     first emission (revision 0, no late readings) of a window read after
//     that of a later window of the same metric.
func Verify(truth []Sent, found []Found, rules Rules) *Report {
	r := &Report{Devices: map[string]*DeviceReport{}}
	want := map[WindowKey]*expectedWindow{}
	ambiguous := map[WindowKey]bool{}
	maxEvent := map[string]time.Time{} // per device: latest accepted event time, in arrival order
	window := func(t time.Time) time.Time {
		return time.Unix(0, t.UnixNano()-mod(t.UnixNano(), int64(rules.Window))).UTC()
	}
	for _, s := range truth {
		d := r.dev(s.Device)
		switch {
		case s.Kind == KindMalformed, s.Kind == KindAliasLost:
			d.Malformed++
			continue
		case !s.Counted():
			d.Uncounted++
			continue
		}
		d.Readings++
		at := s.Time
		unset := !s.Bare && !rules.TimeFloor.IsZero() && s.Time.Before(rules.TimeFloor)
		if unset && rules.UntrustedDeviceTime == "deadletter" {
			d.Dropped++
			continue
		}
		if s.Bare || unset {
			// The gateway stamps a bare reading with its arrival, which
			// lies between the attempt's start and end.
			at = s.SendStart
			if !window(s.SendStart).Equal(window(s.SentAt)) {
				ambiguous[WindowKey{s.Device, s.Metric, window(s.SendStart)}] = true
				ambiguous[WindowKey{s.Device, s.Metric, window(s.SentAt)}] = true
			}
		} else if limit := rules.MaxFutureSkew; s.Time.After(s.SentAt.Add(limit)) {
			d.Dropped++
			continue
		} else if s.Time.After(s.SendStart.Add(limit)) {
			ambiguous[WindowKey{s.Device, s.Metric, window(s.Time)}] = true
			continue
		}
		if m, ok := maxEvent[s.Device]; ok && at.Before(m.Add(-rules.MaxOutOfOrder-rules.AllowedLateness)) {
			d.Dropped++
			continue
		}
		if at.After(maxEvent[s.Device]) {
			maxEvent[s.Device] = at
		}
		k := WindowKey{s.Device, s.Metric, window(at)}
		w := want[k]
		if w == nil {
			w = &expectedWindow{}
			want[k] = w
		}
		w.add(at, s.Value, s.Unit)
		if s.Bare || unset {
			w.gateway++
		}
		if unset {
			w.replaced++
		}
	}

	// The highest revision of each window, duplicates and order.
	ids := map[string]int{}
	top := map[WindowKey]Found{}
	partition := map[string]int32{}
	lastRev := map[WindowKey]int{}
	lastFirst := map[[2]string]time.Time{}
	read := slices.Clone(found)
	slices.SortStableFunc(read, func(a, b Found) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	for _, f := range read {
		d := r.dev(f.Device)
		k := WindowKey{f.Device, f.Metric, f.WindowStart.UTC()}
		if ids[f.ID]++; ids[f.ID] == 2 {
			d.Duplicates++
			r.problem("%s: duplicate: summary %s (revision %d) read more than once", k, f.ID, f.Revision)
		}
		if ids[f.ID] > 1 {
			continue
		}
		if p, ok := partition[f.Device]; ok && p != f.Partition {
			d.Order++
			r.problem("%s: order: device on partitions %d and %d", k, p, f.Partition)
		}
		partition[f.Device] = f.Partition
		if last, ok := lastRev[k]; ok && f.Revision < last {
			d.Order++
			r.problem("%s: order: revision %d read after revision %d", k, f.Revision, last)
		}
		lastRev[k] = max(lastRev[k], f.Revision)
		if f.Revision == 0 && f.Late == 0 {
			mk := [2]string{f.Device, f.Metric}
			if prev, ok := lastFirst[mk]; ok && f.WindowStart.Before(prev) {
				d.Order++
				r.problem("%s: order: first emitted after the window of %s", k, prev.UTC().Format(time.RFC3339))
			}
			if f.WindowStart.After(lastFirst[mk]) {
				lastFirst[mk] = f.WindowStart
			}
		}
		if cur, ok := top[k]; !ok || f.Revision > cur.Revision {
			top[k] = f
		}
	}

	keys := slices.Collect(func(yield func(WindowKey) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
		for k := range top {
			if _, ok := want[k]; !ok && !yield(k) {
				return
			}
		}
	})
	slices.SortFunc(keys, func(a, b WindowKey) int {
		return cmp.Or(strings.Compare(a.Device, b.Device), strings.Compare(a.Metric, b.Metric), a.Start.Compare(b.Start))
	})
	for _, k := range keys {
		d := r.dev(k.Device)
		w, expected := want[k]
		f, got := top[k]
		if ambiguous[k] {
			d.Ambiguous++
			continue
		}
		if expected {
			d.Expected++
		}
		if got {
			d.Found++
		}
		switch {
		case expected && !got:
			d.Missing++
			r.problem("%s: missing: %d readings, no summary", k, len(w.values))
		case got && !expected:
			d.Unexpected++
			r.problem("%s: unexpected: summary %s with count %d, no reading sent", k, f.ID, f.Count)
		default:
			if diffs := compare(w, f); len(diffs) > 0 {
				d.Differ++
				r.problem("%s: differs (revision %d): %s", k, f.Revision, strings.Join(diffs, ", "))
			}
		}
	}
	for _, d := range r.Devices {
		r.Total.add(*d)
	}
	return r
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// compare lists the fields of f that differ from the expectation.
func compare(w *expectedWindow, f Found) []string {
	n := len(w.values)
	sum, lo, hi := 0.0, math.Inf(1), math.Inf(-1)
	for _, v := range w.values {
		sum += v
		lo, hi = min(lo, v), max(hi, v)
	}
	mean := sum / float64(n)
	ss := 0.0
	for _, v := range w.values {
		ss += (v - mean) * (v - mean)
	}
	stddev := math.Sqrt(ss / float64(n))
	var diffs []string
	if f.Count != int64(n) {
		diffs = append(diffs, fmt.Sprintf("count %d, want %d", f.Count, n))
	}
	for _, c := range []struct {
		name      string
		got, want float64
		tol       float64
	}{
		{"sum", f.Sum, sum, 1e-9}, {"min", f.Min, lo, 0}, {"max", f.Max, hi, 0}, {"mean", f.Mean, mean, 1e-9},
		{"first", f.First, w.first, 0}, {"last", f.Last, w.last, 0}, {"stddev", f.Stddev, stddev, 1e-6},
	} {
		if math.Abs(c.got-c.want) > c.tol*max(1, math.Abs(c.want)) {
			diffs = append(diffs, fmt.Sprintf("%s %v, want %v", c.name, c.got, c.want))
		}
	}
	if w.unit != "" && f.Unit != w.unit {
		diffs = append(diffs, fmt.Sprintf("unit %q, want %q", f.Unit, w.unit))
	}
	if f.TimeSource != "" { // older gateways do not say
		source := "mixed"
		switch w.gateway {
		case 0:
			source = "device"
		case n:
			source = "gateway"
		}
		if f.TimeSource != source {
			diffs = append(diffs, fmt.Sprintf("time_source %q, want %q", f.TimeSource, source))
		}
		if f.TimeReplaced != int64(w.replaced) {
			diffs = append(diffs, fmt.Sprintf("time_replaced %d, want %d", f.TimeReplaced, w.replaced))
		}
	}
	return diffs
}

// WriteTable prints the report: one row per device with a problem (all
// devices with all), the total, and up to maxProblems problem lines.
func (r *Report) WriteTable(w io.Writer, all bool, maxProblems int) {
	fmt.Fprintf(w, "%-20s %8s %8s %8s %8s %10s %7s %6s %5s %9s %7s %9s %9s\n",
		"device", "readings", "expected", "found", "missing", "unexpected", "differ", "dupes", "order", "ambiguous", "dropped", "malformed", "uncounted")
	row := func(name string, d DeviceReport) {
		fmt.Fprintf(w, "%-20s %8d %8d %8d %8d %10d %7d %6d %5d %9d %7d %9d %9d\n", name, d.Readings, d.Expected, d.Found,
			d.Missing, d.Unexpected, d.Differ, d.Duplicates, d.Order, d.Ambiguous, d.Dropped, d.Malformed, d.Uncounted)
	}
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range r.Devices {
			if !yield(id) {
				return
			}
		}
	}) {
		d := *r.Devices[id]
		if all || d.Missing+d.Unexpected+d.Differ+d.Duplicates+d.Order > 0 {
			row(id, d)
		}
	}
	row("TOTAL", r.Total)
	for i, p := range r.Problems {
		if i == maxProblems {
			fmt.Fprintf(w, "… and %d more problems\n", len(r.Problems)-i)
			break
		}
		fmt.Fprintln(w, p)
	}
	if r.OK() {
		fmt.Fprintln(w, "OK: every window matches the truth log")
	} else {
		fmt.Fprintln(w, "MISMATCH")
	}
}
