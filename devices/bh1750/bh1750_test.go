package bh1750

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/firmware-sim/chips"
	"periph.io/x/conn/v3/i2c/i2ctest"
)

func noSleep(d *Dev) *Dev { d.sleep = func(time.Duration) {}; return d }

// TestDatasheetExample replays the datasheet's worked example (p. 7): a
// count of 1000_0011 1001_0000 (33680) in high-resolution mode is
// 33680 / 1.2 ≈ 28067 lx.
func TestDatasheetExample(t *testing.T) {
	bus := &i2ctest.Playback{Ops: []i2ctest.IO{
		{Addr: 0x23, W: []byte{0x01}},
		{Addr: 0x23, W: []byte{0x42}}, // MTreg 69 = 0b010_00101: high bits
		{Addr: 0x23, W: []byte{0x65}}, // low bits
		{Addr: 0x23, W: []byte{0x01}},
		{Addr: 0x23, W: []byte{0x20}},
		{Addr: 0x23, R: []byte{0x83, 0x90}},
	}}
	d, err := NewI2C(bus, 0x23, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	lux, err := d.Sense()
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Close(); err != nil {
		t.Fatal(err)
	}
	if lux != 28066666 || lux.String() != "28066.666lx" {
		t.Errorf("got %s (%d mlx), want 28066.666lx", lux, lux)
	}
}

// TestAgainstEmulator: across 0…50,000 lx, at the default and the longest
// measurement time, within one count.
func TestAgainstEmulator(t *testing.T) {
	for _, mt := range []uint8{69, 254} {
		bus := chips.NewBus("emu")
		chip := chips.NewBH1750()
		bus.Attach(0x5C, chip)
		d, err := NewI2C(bus, 0x5C, &Opts{MTreg: mt})
		if err != nil {
			t.Fatal(err)
		}
		noSleep(d)
		if mt == 254 && d.MeasureTime() != 180*time.Millisecond*254/69 {
			t.Errorf("measure time %v", d.MeasureTime())
		}
		count := 1 / 1.2 * 69 / float64(mt) // lux per count
		max := 54612.0 * 69 / float64(mt)   // where the count saturates
		for lux := 0.0; lux <= 50000; lux += 1234.5 {
			chip.Set(lux)
			got, err := d.Sense()
			if err != nil {
				t.Fatal(err)
			}
			want := math.Min(lux, max)
			if g := float64(got) / float64(Lux); math.Abs(g-want) > count {
				t.Errorf("MTreg %d: set %.1f lx, read %s", mt, lux, got)
			}
		}
	}
}

func TestFaults(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewBH1750()
	bus.Attach(0x23, chip)
	if _, err := NewI2C(bus, 0x23, &Opts{MTreg: 20}); err == nil || !strings.Contains(err.Error(), "MTreg 20") {
		t.Errorf("bad MTreg: %v", err)
	}
	if _, err := NewI2C(bus, 0x5C, nil); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "bh1750 at 0x5c: power on") {
		t.Errorf("absent sensor: %v", err)
	}
	d, err := NewI2C(bus, 0x23, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	bus.FailShortRead(1)
	if _, err := d.Sense(); !errors.Is(err, chips.ErrShortRead) || !strings.Contains(err.Error(), "bh1750 at 0x23: read measurement") {
		t.Errorf("short read: %v", err)
	}
	chip.FailNACK(1)
	if _, err := d.Sense(); !errors.Is(err, chips.ErrNACK) {
		t.Errorf("NACK: %v", err)
	}
	if _, err := d.Sense(); err != nil {
		t.Errorf("after the NACK: %v", err)
	}
}

// TestProbe finds a sensor that acknowledges power on and down, not an
// empty address, and leaves the sensor powered down (a measurement
// instruction is then refused).
func TestProbe(t *testing.T) {
	bus := chips.NewBus("emu")
	bus.Attach(AltAddr, chips.NewBH1750())
	if err := Probe(bus, AltAddr); err != nil {
		t.Errorf("sensor at 0x5c: %v", err)
	}
	if err := bus.Tx(AltAddr, []byte{opOneTimeH}, nil); !errors.Is(err, chips.ErrNACK) {
		t.Errorf("measurement after Probe: %v, want a NACK (powered down)", err)
	}
	if err := Probe(bus, Addr); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "bh1750 at 0x23: power on") {
		t.Errorf("no sensor: %v", err)
	}
}
