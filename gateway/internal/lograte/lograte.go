// Package lograte keeps floods out of the log: a Limiter lets one line per
// key through per interval and counts the ones it held back, so that a
// device sending garbage in a loop costs a line every few seconds, not a
// full SD card.
package lograte

import (
	"sync"
	"time"
)

// Limiter lets one log line per key through every Every. The zero value
// lets everything through; it is safe for concurrent use.
type Limiter struct {
	Every time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

// Allow reports whether to log now, and how many lines for key were held
// back since the last one that was let through.
func (r *Limiter) Allow(key string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last, r.held = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := r.last[key]; ok && now.Sub(t) < r.Every {
		r.held[key]++
		return false, 0
	}
	if len(r.last) > 1000 { // keys are reasons; bound it anyway
		clear(r.last)
	}
	n := r.held[key]
	r.last[key] = now
	delete(r.held, key)
	return true, n
}
