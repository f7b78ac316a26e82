package gateway

import (
	"sync"
	"time"

	"github.com/edgegate/edgegate/gateway/clock"
	"github.com/edgegate/edgegate/gateway/journal"
)

// ClockStats is what the gateway knows of its own clock, for the status
// page and metrics.
type ClockStats struct {
	// Synchronized: the kernel says an NTP (or PTP, GPS) daemon
	// disciplines the clock (Source "adjtimex"), or the configuration says
	// the clock is right (Source "assumed", clock.synchronized: always).
	Synchronized bool
	Source       string
	MaxError     time.Duration // the kernel's bound on the clock's error; 0 when unknown
	Error        string        `json:",omitempty"` // why the status could not be read
	Boot         string        // the kernel's boot id
	// Steps counts the steps of the wall clock (jumps against the
	// monotonic clock of more than 1 s) seen since the gateway started;
	// LastStep is the latest one's size (negative: back) and LastStepAt
	// the wall time after it.
	Steps      uint64
	LastStep   time.Duration
	LastStepAt time.Time
	// Offset is the gateway's time minus the wall clock: non-zero while
	// the gateway keeps time by the monotonic clock after a step of an
	// unsynchronized clock.
	Offset time.Duration
}

// clockWatch follows the clock live, once a second from Run's loop:
// steps, by comparing the wall clock with the monotonic one, and changes
// of the synchronization, which it hands to the journal (the applier
// decides by the journal alone). Each is logged once.
type clockWatch struct {
	mu       sync.Mutex
	st       ClockStats
	lastWall time.Time
	lastMono time.Duration
}

func (w *clockWatch) init(c clock.Clock) clock.Sync {
	s := c.Sync()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st = ClockStats{Synchronized: s.Synchronized, Source: s.Source, MaxError: s.MaxError, Error: s.Err, Boot: c.BootID()}
	w.lastWall, w.lastMono = c.Now(), c.Monotonic()
	return s
}

// watchClock samples the clock: a step is logged with its size, a change
// of synchronization is logged and journaled.
func (g *Gateway) watchClock() {
	c, w := g.clk, &g.cw
	now, mono, s := c.Now(), c.Monotonic(), c.Sync()
	w.mu.Lock()
	dm := mono - w.lastMono
	step := now.Sub(w.lastWall) - dm
	stepped := step > time.Duration(stepTolerance(int64(dm))) || -step > time.Duration(stepTolerance(int64(dm)))
	if stepped {
		w.st.Steps++
		w.st.LastStep, w.st.LastStepAt = step, now
	}
	changed := s.Synchronized != w.st.Synchronized
	w.st.Synchronized, w.st.Source, w.st.MaxError, w.st.Error = s.Synchronized, s.Source, s.MaxError, s.Err
	w.lastWall, w.lastMono = now, mono
	w.mu.Unlock()
	if changed {
		g.j.SetClock(clockState(c.BootID(), s))
		if s.Synchronized {
			// Journaled now, not at the next event, so that readings
			// held for it are released even while nothing arrives.
			g.j.Clock(journal.KindTick)
		}
		if s.Synchronized {
			g.log.Info("gateway clock synchronized; readings stamped on arrival are re-based on it from now on",
				"source", s.Source, "max_error", s.MaxError.String(), "time", now.UTC())
		} else {
			g.log.Warn("gateway clock no longer synchronized; readings are not judged against it (aggregate.max_future_skew)",
				"source", s.Source, "max_error", s.MaxError.String(), "err", s.Err)
		}
	}
	if stepped {
		how := "following it: the clock is synchronized"
		if !s.Synchronized {
			how = "keeping time by the monotonic clock until it is synchronized"
		}
		g.log.Warn("gateway clock stepped; "+how+"; open windows are not closed by it", "step", step.String(), "time", now.UTC())
	}
}

// clockStats returns the clock's state; the offset is the applier's,
// given by the caller (under g.mu).
func (w *clockWatch) clockStats(offset int64) ClockStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.st
	st.Offset = time.Duration(offset)
	return st
}
