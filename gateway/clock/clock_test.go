package clock

import (
	"runtime"
	"testing"
	"time"
)

// TestSystem reads the machine's clock: the monotonic time advances, the
// boot id stays, and on Linux the synchronization comes from adjtimex
// without error (synchronized or not depends on the machine's NTP).
func TestSystem(t *testing.T) {
	c := System()
	m1 := c.Monotonic()
	time.Sleep(10 * time.Millisecond)
	m2 := c.Monotonic()
	if m2-m1 < 10*time.Millisecond || m1 <= 0 {
		t.Errorf("monotonic %v then %v, 10 ms apart", m1, m2)
	}
	if id := c.BootID(); id == "" || id != System().BootID() {
		t.Errorf("boot id %q, then %q", id, System().BootID())
	}
	s := c.Sync()
	if runtime.GOOS == "linux" && (s.Source != "adjtimex" || s.Err != "") {
		t.Errorf("sync %+v: want it from adjtimex", s)
	}
	if a := Assumed(c).Sync(); !a.Synchronized || a.Source != "assumed" {
		t.Errorf("assumed: %+v", a)
	}
	t.Logf("this machine: %+v, boot %s, %v since boot", s, c.BootID(), m2)
}

// TestFromWall: the monotonic time of a wall clock advances with it and
// stands still when it goes back, and two instances on one clock agree.
func TestFromWall(t *testing.T) {
	wall := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	c := FromWall(func() time.Time { return wall })
	m0 := c.Monotonic()
	wall = wall.Add(time.Minute)
	m1 := c.Monotonic()
	wall = wall.Add(-2 * time.Hour)
	m2 := c.Monotonic()
	wall = wall.Add(time.Second)
	m3 := c.Monotonic()
	if m1-m0 != time.Minute || m2 != m1 || m3-m2 != time.Second {
		t.Errorf("monotonic %v %v %v %v: want +1m, +0, +1s", m0, m1, m2, m3)
	}
	if !c.Sync().Synchronized || FromWall(func() time.Time { return wall }).BootID() != c.BootID() {
		t.Error("a wall clock is synchronized, one boot")
	}
}

// TestManual: Advance moves both clocks, Step the wall alone, Reboot starts
// a new boot.
func TestManual(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	m := NewManual(t0, false)
	boot, mono := m.BootID(), m.Monotonic()
	m.Advance(time.Second)
	m.Step(-time.Hour)
	if !m.Now().Equal(t0.Add(time.Second-time.Hour)) || m.Monotonic() != mono+time.Second || m.Sync().Synchronized {
		t.Errorf("now %v, monotonic %v, sync %+v", m.Now(), m.Monotonic(), m.Sync())
	}
	m.SetSynchronized(true)
	m.Reboot(t0, false)
	if m.BootID() == boot || m.Monotonic() != 10*time.Second || m.Sync().Synchronized || !m.Now().Equal(t0) {
		t.Errorf("after reboot: boot %s (was %s), monotonic %v, sync %+v", m.BootID(), boot, m.Monotonic(), m.Sync())
	}
}
