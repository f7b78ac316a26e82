package sht3x

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/firmware-sim/chips"
	"periph.io/x/conn/v3/i2c/i2ctest"
	"periph.io/x/conn/v3/physic"
)

func noSleep(d *Dev) *Dev { d.sleep = func(time.Duration) {}; return d }

// TestCRC8 checks the datasheet's example (§4.12, table 20): 0xBEEF has
// CRC 0x92.
func TestCRC8(t *testing.T) {
	if c := CRC8([]byte{0xBE, 0xEF}); c != 0x92 {
		t.Errorf("CRC8(0xBEEF) = %#02x, want 0x92", c)
	}
}

// TestPlayback replays the exact bytes of an init and a measurement:
// S_T 0x6666 is -45 + 175*26214/65535 = 25 °C exactly (26214 = 0.4 *
// 65535), S_RH 0x8000 is 100*32768/65535 = 50.00076 %RH (§4.13).
func TestPlayback(t *testing.T) {
	withCRC := func(b ...byte) []byte {
		var out []byte
		for i := 0; i < len(b); i += 2 {
			out = append(out, b[i], b[i+1], CRC8(b[i:i+2]))
		}
		return out
	}
	bus := &i2ctest.Playback{Ops: []i2ctest.IO{
		{Addr: 0x44, W: []byte{0x30, 0xA2}},
		{Addr: 0x44, W: []byte{0xF3, 0x2D}},
		{Addr: 0x44, R: withCRC(0x00, 0x10)},
		{Addr: 0x44, W: []byte{0x24, 0x00}},
		{Addr: 0x44, R: withCRC(0x66, 0x66, 0x80, 0x00)},
	}}
	d, err := NewI2C(bus, 0x44, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	var e physic.Env
	if err := d.Sense(&e); err != nil {
		t.Fatal(err)
	}
	if err := bus.Close(); err != nil {
		t.Fatal(err)
	}
	if e.Temperature != 25*physic.Celsius+physic.ZeroCelsius {
		t.Errorf("temperature %d nK, want 25°C", e.Temperature)
	}
	if h := float64(e.Humidity) / float64(physic.PercentRH); math.Abs(h-50.00076) > 1e-5 {
		t.Errorf("humidity %.6f%%, want 50.00076", h)
	}
}

func TestAgainstEmulator(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewSHT3x()
	bus.Attach(0x45, chip)
	d, err := NewI2C(bus, 0x45, &Opts{Repeatability: Medium})
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	n := 0
	t0, b0 := bus.Counts()
	for tc := -40.0; tc <= 125; tc += 7.3 {
		for rh := 0.0; rh <= 100; rh += 9.1 {
			chip.Set(tc, rh)
			var e physic.Env
			if err := d.Sense(&e); err != nil {
				t.Fatal(err)
			}
			gotT := float64(e.Temperature-physic.ZeroCelsius) / float64(physic.Celsius)
			gotH := float64(e.Humidity) / float64(physic.PercentRH)
			// One count is 175/65535 °C and 100/65535 %RH.
			if math.Abs(gotT-tc) > 175.0/65535 || math.Abs(gotH-rh) > 100.0/65535 {
				t.Errorf("set %.2f°C %.2f%%RH, read %.5f°C %.5f%%RH", tc, rh, gotT, gotH)
			}
			n++
		}
	}
	t1, b1 := bus.Counts()
	t.Logf("per Sense: %.1f transactions, %.1f bytes", float64(t1-t0)/float64(n), float64(b1-b0)/float64(n))
}

func TestFaults(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewSHT3x()
	bus.Attach(0x44, chip)
	if _, err := NewI2C(bus, 0x45, nil); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "sht3x at 0x45") {
		t.Errorf("absent sensor: %v", err)
	}
	chip.FailCRC(1)
	if _, err := NewI2C(bus, 0x44, nil); !errors.Is(err, ErrCRC) {
		t.Errorf("bad status CRC: %v", err)
	}
	d, err := NewI2C(bus, 0x44, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	var e physic.Env
	chip.FailCRC(1)
	if err := d.Sense(&e); !errors.Is(err, ErrCRC) || !strings.Contains(err.Error(), "temperature") {
		t.Errorf("bad measurement CRC: %v", err)
	}
	chip.FailBusy(2) // slower than the datasheet's maximum: read again
	if err := d.Sense(&e); err != nil {
		t.Errorf("slow measurement: %v", err)
	}
	chip.FailBusy(10)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "read measurement") {
		t.Errorf("no result: %v", err)
	}
	bus.FailShortRead(1)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrShortRead) || !strings.Contains(err.Error(), "sht3x at 0x44: read measurement") {
		t.Errorf("short read: %v", err)
	}
	bus.SetStuck(true)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrStuck) {
		t.Errorf("stuck bus: %v", err)
	}
}

// TestProbe identifies the sensor by a status word with a valid CRC, and
// rejects a wrong checksum and an empty address.
func TestProbe(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewSHT3x()
	bus.Attach(Addr, chip)
	if st, err := Probe(bus, Addr); err != nil || st != 0x0010 {
		t.Errorf("status %#04x, %v; want 0x0010 (reset seen)", st, err)
	}
	chip.FailCRC(1)
	if _, err := Probe(bus, Addr); !errors.Is(err, ErrCRC) || !strings.Contains(err.Error(), "sht3x at 0x44: status") {
		t.Errorf("bad CRC: %v", err)
	}
	if _, err := Probe(bus, AltAddr); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "sht3x at 0x45: read status") {
		t.Errorf("no sensor: %v", err)
	}
	if chip.Count() != 0 {
		t.Errorf("probing made %d measurements", chip.Count())
	}
}
