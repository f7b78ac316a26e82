// Package clock is what the gateway knows of its own clock: the wall time;
// a monotonic time that counts through suspend (CLOCK_BOOTTIME), is never
// stepped, and starts again at each boot; the identity of that boot; and
// whether the kernel's clock is synchronized (adjtimex, which chrony, ntpd
// and systemd-timesyncd maintain).
//
// A Raspberry Pi has no real-time clock: it boots at the time it last
// saved (fake-hwclock) or at 1970, and NTP steps the clock, often by hours,
// once the network is up. Comparing the wall clock with the monotonic one
// detects such steps; the synchronization status says when the wall clock
// can be believed.
package clock

import (
	"strconv"
	"sync"
	"time"
)

// Clock is the gateway's view of time. Its methods are safe for
// concurrent use.
type Clock interface {
	// Now returns the wall clock.
	Now() time.Time
	// Monotonic returns the time since boot (CLOCK_BOOTTIME on Linux):
	// it never goes backwards and is not stepped with the wall clock,
	// within one boot.
	Monotonic() time.Duration
	// BootID names the boot Monotonic counts from: two readings of
	// Monotonic compare only under the same boot id.
	BootID() string
	// Sync returns the kernel clock's synchronization status.
	Sync() Sync
}

// Sync is the synchronization status of the wall clock.
type Sync struct {
	// Synchronized: an NTP (or PTP, GPS) daemon disciplines the clock, so
	// its time can be believed.
	Synchronized bool
	// MaxError is the kernel's bound on the clock's error (adjtimex
	// maxerror), 0 when unknown.
	MaxError time.Duration
	// Source says how the status was found: "adjtimex", "assumed" (the
	// configuration says the clock is right) or "unknown" (the platform
	// cannot tell; the clock is then taken as synchronized).
	Source string
	// Err is why the status could not be read, if it could not.
	Err string `json:",omitempty"`
}

// unsyncMaxError is the maxerror from which the kernel clock is taken as
// unsynchronized even without STA_UNSYNC: the kernel grows maxerror by 500
// ppm while no daemon updates it, and caps it at 16 s, which systemd's
// timedatectl also reads as "not synchronized".
const unsyncMaxError = 16 * time.Second

// Assumed wraps c so that its clock is reported synchronized: for a
// gateway whose clock is set by means the kernel does not know of (a
// battery-backed real-time clock, a test machine without NTP).
func Assumed(c Clock) Clock { return assumed{c} }

type assumed struct{ Clock }

func (a assumed) Sync() Sync {
	s := a.Clock.Sync()
	s.Synchronized, s.Source = true, "assumed"
	return s
}

// FromWall returns a Clock on a wall clock alone, synchronized, for
// callers (tests, tools) that inject only a wall clock. Its monotonic time
// advances as the wall clock advances, and stands still when it goes
// back, so that a backward step of now is seen as a step.
func FromWall(now func() time.Time) Clock {
	return &fromWall{now: now}
}

type fromWall struct {
	now  func() time.Time
	mu   sync.Mutex
	last time.Time
	mono time.Duration
	set  bool
}

func (f *fromWall) Now() time.Time { return f.now() }

func (f *fromWall) Monotonic() time.Duration {
	t := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.set {
		// Counted from 1970, so that instances made over the same clock
		// (a gateway restarted in one test) agree.
		f.set, f.last, f.mono = true, t, time.Duration(t.UnixNano())
		return f.mono
	}
	if d := t.Sub(f.last); d > 0 {
		f.mono += d
	}
	f.last = t
	return f.mono
}

func (f *fromWall) BootID() string { return "wall-clock" }

func (f *fromWall) Sync() Sync { return Sync{Synchronized: true, Source: "assumed"} }

// Manual is a Clock moved by hand, for tests: the wall clock, the
// monotonic clock, the boot and the synchronization status change only
// when told.
type Manual struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
	boot int
	sync Sync
}

// NewManual returns a Manual clock at wall time wall, 1 minute after boot.
func NewManual(wall time.Time, synchronized bool) *Manual {
	return &Manual{wall: wall, mono: time.Minute, boot: 1, sync: Sync{Synchronized: synchronized, Source: "manual"}}
}

func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wall
}

func (m *Manual) Monotonic() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mono
}

func (m *Manual) BootID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return "manual-boot-" + strconv.Itoa(m.boot)
}

func (m *Manual) Sync() Sync {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sync
}

// Advance lets d pass: both clocks move.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wall = m.wall.Add(d)
	m.mono += d
}

// Step steps the wall clock by d (negative: back), as NTP or date -s do;
// the monotonic clock does not move.
func (m *Manual) Step(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wall = m.wall.Add(d)
}

// SetSynchronized sets the synchronization status.
func (m *Manual) SetSynchronized(s bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sync.Synchronized = s
}

// Reboot starts a new boot at wall time wall: a new boot id, and the
// monotonic clock at 10 s.
func (m *Manual) Reboot(wall time.Time, synchronized bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boot++
	m.wall, m.mono, m.sync.Synchronized = wall, 10*time.Second, synchronized
}
