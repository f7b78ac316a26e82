package clock

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// System returns the machine's clock: time.Now, CLOCK_BOOTTIME, the
// kernel's boot id (/proc/sys/kernel/random/boot_id) and adjtimex.
func System() Clock { return &system{boot: bootID()} }

type system struct{ boot string }

func (*system) Now() time.Time { return time.Now() }

func (*system) Monotonic() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Every Linux since 2.6.39 has it; without it, CLOCK_MONOTONIC
		// (which stops during suspend) is the next best.
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return 0
		}
	}
	return time.Duration(ts.Nano())
}

func (s *system) BootID() string { return s.boot }

func (*system) Sync() Sync {
	var tx unix.Timex // Modes 0: read only
	if _, err := unix.Adjtimex(&tx); err != nil {
		return Sync{Synchronized: false, Source: "adjtimex", Err: "adjtimex: " + err.Error()}
	}
	maxErr := time.Duration(int64(tx.Maxerror)) * time.Microsecond
	return Sync{
		Synchronized: tx.Status&unix.STA_UNSYNC == 0 && maxErr < unsyncMaxError,
		MaxError:     maxErr,
		Source:       "adjtimex",
	}
}

// bootID reads the kernel's id of the current boot. Without it (no /proc),
// a random id per process makes every start a new boot: monotonic times
// are then never compared across restarts.
func bootID() string {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id
		}
	}
	var r [16]byte
	rand.Read(r[:])
	return "process-" + hex.EncodeToString(r[:])
}
