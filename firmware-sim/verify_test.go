package firmwaresim_test

import (
	"strings"
	"testing"
	"time"

	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

var w0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func reading(dev string, at time.Time, v float64) firmwaresim.Sent {
	return firmwaresim.Sent{Device: dev, Metric: "m", Time: at, Value: v, QoS: 1, Acked: true, Kind: firmwaresim.KindReading, SendStart: at, SentAt: at}
}

func found(dev string, start time.Time, count int64, sum, lo, hi, first, last, stddev float64) firmwaresim.Found {
	return firmwaresim.Found{ID: dev + start.String(), Device: dev, Metric: "m", WindowStart: start, Count: count, Sum: sum,
		Min: lo, Max: hi, Mean: sum / float64(count), First: first, Last: last, Stddev: stddev}
}

// TestVerifyRules checks the expectation's rules one by one.
func TestVerifyRules(t *testing.T) {
	rules := firmwaresim.DefaultRules()
	t.Run("ties: first keeps the earlier arrival, last takes the later", func(t *testing.T) {
		truth := []firmwaresim.Sent{reading("a", w0.Add(time.Second), 5), reading("a", w0.Add(time.Second), 7)}
		r := firmwaresim.Verify(truth, []firmwaresim.Found{found("a", w0, 2, 12, 5, 7, 5, 7, 1)}, rules)
		if !r.OK() {
			t.Error(r.Problems)
		}
	})
	t.Run("unacknowledged readings are not expected", func(t *testing.T) {
		lost := reading("a", w0.Add(2*time.Second), 100)
		lost.Acked, lost.Err = false, "connection lost"
		truth := []firmwaresim.Sent{reading("a", w0.Add(time.Second), 5), lost}
		r := firmwaresim.Verify(truth, []firmwaresim.Found{found("a", w0, 1, 5, 5, 5, 5, 5, 0)}, rules)
		if !r.OK() || r.Total.Uncounted != 1 {
			t.Errorf("ok %v, uncounted %d: %v", r.OK(), r.Total.Uncounted, r.Problems)
		}
	})
	t.Run("too far ahead is a dead letter", func(t *testing.T) {
		ahead := reading("a", w0.Add(10*time.Minute), 9)
		ahead.SendStart, ahead.SentAt = w0, w0.Add(time.Millisecond)
		truth := []firmwaresim.Sent{reading("a", w0.Add(time.Second), 5), ahead}
		r := firmwaresim.Verify(truth, []firmwaresim.Found{found("a", w0, 1, 5, 5, 5, 5, 5, 0)}, rules)
		if !r.OK() || r.Total.Dropped != 1 {
			t.Errorf("ok %v, dropped %d: %v", r.OK(), r.Total.Dropped, r.Problems)
		}
	})
	t.Run("too late is a dead letter", func(t *testing.T) {
		rules := rules
		rules.AllowedLateness = time.Hour
		old := reading("a", w0.Add(-2*time.Hour), 1)
		old.SendStart, old.SentAt = w0.Add(2*time.Second), w0.Add(2*time.Second)
		truth := []firmwaresim.Sent{reading("a", w0.Add(time.Second), 5), old}
		r := firmwaresim.Verify(truth, []firmwaresim.Found{found("a", w0, 1, 5, 5, 5, 5, 5, 0)}, rules)
		if !r.OK() || r.Total.Dropped != 1 {
			t.Errorf("ok %v, dropped %d: %v", r.OK(), r.Total.Dropped, r.Problems)
		}
	})
	t.Run("a bare reading across a window edge is ambiguous", func(t *testing.T) {
		bare := reading("a", time.Time{}, 3)
		bare.Bare = true
		bare.SendStart, bare.SentAt = w0.Add(-time.Millisecond), w0.Add(time.Millisecond)
		r := firmwaresim.Verify([]firmwaresim.Sent{bare}, []firmwaresim.Found{found("a", w0, 1, 3, 3, 3, 3, 3, 0)}, rules)
		if !r.OK() || r.Total.Ambiguous != 2 { // both windows it may be in
			t.Errorf("ok %v, ambiguous %d: %v", r.OK(), r.Total.Ambiguous, r.Problems)
		}
	})
	t.Run("a clock never set: stamped on arrival, and the summary says so", func(t *testing.T) {
		unset := reading("a", time.Unix(10, 0), 3) // 1970
		unset.SendStart, unset.SentAt = w0.Add(2*time.Second), w0.Add(2*time.Second)
		truth := []firmwaresim.Sent{reading("a", w0.Add(time.Second), 5), unset}
		f := found("a", w0, 2, 8, 3, 5, 5, 3, 1)
		f.TimeSource, f.TimeReplaced = "mixed", 1
		if r := firmwaresim.Verify(truth, []firmwaresim.Found{f}, rules); !r.OK() {
			t.Error(r.Problems)
		}
		f.TimeSource, f.TimeReplaced = "device", 0
		r := firmwaresim.Verify(truth, []firmwaresim.Found{f}, rules)
		if r.OK() || !strings.Contains(strings.Join(r.Problems, ""), `time_source "device", want "mixed", time_replaced 0, want 1`) {
			t.Errorf("problems %v", r.Problems)
		}
		rules := rules
		rules.UntrustedDeviceTime = "deadletter"
		r = firmwaresim.Verify(truth, []firmwaresim.Found{found("a", w0, 1, 5, 5, 5, 5, 5, 0)}, rules)
		if !r.OK() || r.Total.Dropped != 1 {
			t.Errorf("deadletter: ok %v, dropped %d: %v", r.OK(), r.Total.Dropped, r.Problems)
		}
	})
	t.Run("a wrong stddev and unit are found", func(t *testing.T) {
		x, y := reading("a", w0, 1), reading("a", w0.Add(time.Second), 3)
		x.Unit, y.Unit = "Cel", "Cel"
		f := found("a", w0, 2, 4, 1, 3, 1, 3, 1.5)
		f.Unit = "K"
		r := firmwaresim.Verify([]firmwaresim.Sent{x, y}, []firmwaresim.Found{f}, rules)
		if r.OK() || !strings.Contains(strings.Join(r.Problems, ""), `stddev 1.5, want 1, unit "K", want "Cel"`) {
			t.Errorf("problems %v", r.Problems)
		}
	})
	t.Run("a device on two partitions", func(t *testing.T) {
		truth := []firmwaresim.Sent{reading("a", w0, 1), reading("a", w0.Add(time.Minute), 2)}
		f1, f2 := found("a", w0, 1, 1, 1, 1, 1, 1, 0), found("a", w0.Add(time.Minute), 1, 2, 2, 2, 2, 2, 0)
		f2.Partition = 1
		r := firmwaresim.Verify(truth, []firmwaresim.Found{f1, f2}, rules)
		if r.OK() || r.Total.Order != 1 {
			t.Errorf("order %d: %v", r.Total.Order, r.Problems)
		}
	})
}
