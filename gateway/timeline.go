package gateway

import (
	"time"

	"github.com/edgegate/edgegate/gateway/clock"
	"github.com/edgegate/edgegate/gateway/journal"
)

// timeline is the applier's account of time: a function of the journal
// alone (each event's wall and monotonic times, and the clock events that
// name the boot and the synchronization), so that a replay makes the same
// decisions as the first run. It gives:
//
//   - the gateway time of each event (clock): the wall time, except after
//     a step of the wall clock while it is not synchronized, when the
//     gateway keeps time by the monotonic clock (offset holds the
//     difference) until the clock is synchronized or the gateway boots
//     again. A step of a synchronized clock is followed: it is a
//     correction. Readings are stamped with it on arrival;
//   - elapsed time, which advances by the monotonic clock only and never
//     goes backwards: idle closing measures silence with it, so that no
//     step freezes windows or closes them all at once.
//
// The state in journal.TimeLine is checkpointed.
type timeline struct {
	journal.TimeLine
	clock int64 // gateway time of the latest event, Unix ns: Wall + Offset
}

// newTimeline is the time line before any event: a synchronized clock (as
// journals without clock events were taken), nothing elapsed.
func newTimeline() timeline {
	return timeline{TimeLine: journal.TimeLine{Valid: true, Synchronized: true}}
}

// stepTolerance is how far the wall clock may drift from the monotonic one
// over d without it being a step: 1 s, plus 1000 ppm (twice the fastest
// slew the kernel applies).
func stepTolerance(d int64) int64 { return int64(time.Second) + d/1000 }

// advance accounts for event e. It returns the step of the wall clock
// since the previous event that e shows (0 if none).
func (tl *timeline) advance(e *journal.Event) (step int64) {
	if e.Kind == journal.KindClock {
		if e.Clock.Boot != tl.Boot {
			// A new boot: its monotonic times mean nothing next to the
			// last boot's, and the wall clock is all there is.
			tl.Boot, tl.HasMono, tl.Offset = e.Clock.Boot, false, 0
		}
		tl.Synchronized = e.Clock.Synchronized
	}
	switch {
	case e.HasMono && tl.HasMono:
		dm := max(0, e.Mono-tl.Mono)
		if dev := e.At - tl.Wall - dm; dev > stepTolerance(dm) || -dev > stepTolerance(dm) {
			step = dev
			if !tl.Synchronized {
				tl.Offset -= dev // keep time by the monotonic clock
			}
		}
		tl.Elapsed += dm
	case !e.HasMono && tl.Wall != 0 && e.At > tl.Wall:
		// A journal written without monotonic times: elapsed time is the
		// wall clock's advance, as it was.
		tl.Elapsed += e.At - tl.Wall
	}
	if tl.Synchronized {
		tl.Offset = 0 // a synchronized clock is right: re-based on it
	}
	tl.Wall, tl.Mono, tl.HasMono = e.At, e.Mono, e.HasMono
	tl.clock = e.At + tl.Offset
	return step
}

// elapsedAt returns the elapsed time at monotonic time mono of boot (or,
// without one, at wall time wall): what Elapsed will read for an event
// journaled then.
func (tl *timeline) elapsedAt(boot string, mono time.Duration, wall time.Time) time.Duration {
	switch {
	case tl.HasMono && boot == tl.Boot:
		return time.Duration(tl.Elapsed + max(0, int64(mono)-tl.Mono))
	case tl.Wall != 0:
		return time.Duration(tl.Elapsed + max(0, wall.UnixNano()-tl.Wall))
	}
	return time.Duration(tl.Elapsed)
}

// restoredTimeline is the time line a checkpoint records; one written
// before there was a time line (version 1) gives its clock as the wall
// time and as elapsed time, which the aggregator's snapshot of then
// measured idle time with.
func restoredTimeline(cp *journal.Checkpoint) timeline {
	if cp.Time.Valid {
		return timeline{TimeLine: cp.Time, clock: cp.Time.Wall + cp.Time.Offset}
	}
	return timeline{TimeLine: journal.TimeLine{Valid: true, Synchronized: true, Wall: cp.Clock, Elapsed: cp.Clock}, clock: cp.Clock}
}

// clockState is what the journal records of the clock.
func clockState(boot string, s clock.Sync) journal.ClockState {
	return journal.ClockState{Boot: boot, Synchronized: s.Synchronized, MaxError: s.MaxError.Microseconds()}
}

// aggClock is the aggregator's Clock: the gateway time of the event being
// applied, and the elapsed time.
type aggClock struct{ tl *timeline }

func (c aggClock) Now() (time.Time, bool) { return time.Unix(0, c.tl.clock), c.tl.Synchronized }
func (c aggClock) Elapsed() time.Duration { return time.Duration(c.tl.Elapsed) }
