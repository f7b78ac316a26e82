package bme280

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

func celsius(t physic.Temperature) float64 {
	return float64(t-physic.ZeroCelsius) / float64(physic.Celsius)
}

func noSleep(d *Dev) *Dev { d.sleep = func(time.Duration) {}; return d }

// TestDatasheetExample replays the BMP280 datasheet's worked example
// (§3.12, table "compensation formula example"): calibration dig_T1 27504
// … dig_P9 6000, adc_T 519888 and adc_P 415148 give t_fine 128422,
// 25.08 °C and 100653.27 Pa (double precision). The 64-bit integer formula
// gives 25767233/256 = 100653.254 Pa for these inputs (worked by hand, and
// in Python with C's truncating division).
func TestDatasheetExample(t *testing.T) {
	calib := []byte{
		0x70, 0x6B, 0x43, 0x67, 0x18, 0xFC, // dig_T1 27504, dig_T2 26435, dig_T3 -1000
		0x7D, 0x8E, 0x43, 0xD6, 0xD0, 0x0B, 0x27, 0x0B, 0x8C, 0x00, 0xF9, 0xFF, // dig_P1 36477 … dig_P5 140, dig_P6 -7
		0x8C, 0x3C, 0xF8, 0xC6, 0x70, 0x17, // dig_P7 15500, dig_P8 -14600, dig_P9 6000
		0x00, 0x00, // 0xA0 reserved, 0xA1 dig_H1 (a BMP280 has none)
	}
	bus := &i2ctest.Playback{Ops: []i2ctest.IO{
		{Addr: 0x77, W: []byte{0xD0}, R: []byte{0x58}},
		{Addr: 0x77, W: []byte{0x88}, R: calib},
		{Addr: 0x77, W: []byte{0xF5, 0x00}},
		{Addr: 0x77, W: []byte{0xF4, 0x25}}, // osrs_t 1x, osrs_p 1x, forced
		{Addr: 0x77, W: []byte{0xF3}, R: []byte{0x00}},
		{Addr: 0x77, W: []byte{0xF7}, R: []byte{0x65, 0x5A, 0xC0, 0x7E, 0xED, 0x00}}, // adc_P 415148, adc_T 519888
	}}
	d, err := NewI2C(bus, 0x77, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	var e physic.Env
	if err := d.Sense(&e); err != nil {
		t.Fatal(err)
	}
	if err := bus.Close(); err != nil {
		t.Fatal(err) // every op was used
	}
	if e.Temperature != 2508*10*physic.MilliKelvin+physic.ZeroCelsius {
		t.Errorf("temperature %s, want 25.08°C", e.Temperature)
	}
	if want := physic.Pressure(25767233) * physic.Pascal / 256; e.Pressure != want {
		t.Errorf("pressure %d nPa, want %d", e.Pressure, want)
	}
	if d := math.Abs(float64(e.Pressure)/float64(physic.Pascal) - 100653.27); d > 0.02 {
		t.Errorf("pressure %s is %.3f Pa from the datasheet's 100653.27", e.Pressure, d)
	}
	if d.Humidity() || e.Humidity != 0 || !strings.HasPrefix(d.String(), "BMP280") {
		t.Errorf("a BMP280 reported humidity: %v %v %s", d.Humidity(), e.Humidity, d)
	}
}

// TestAgainstEmulator sets physical values across the chip's range in the
// register-level emulator and reads them back through the driver: each
// within the chip's quantisation.
func TestAgainstEmulator(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewBME280()
	bus.Attach(0x76, chip)
	d, err := NewI2C(bus, 0x76, &Opts{Temperature: O2x, Pressure: O16x, Humidity: O1x})
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	n := 0
	for tc := -40.0; tc <= 85; tc += 12.5 {
		for pa := 30000.0; pa <= 110000; pa += 16000 {
			for rh := 0.0; rh <= 100; rh += 20 {
				chip.Set(tc, pa, rh)
				var e physic.Env
				if err := d.Sense(&e); err != nil {
					t.Fatal(err)
				}
				gotT, gotP := celsius(e.Temperature), float64(e.Pressure)/float64(physic.Pascal)
				gotH := float64(e.Humidity) / float64(physic.PercentRH)
				if math.Abs(gotT-tc) > 0.011 || math.Abs(gotP-pa) > 0.5 || math.Abs(gotH-rh) > 0.02 {
					t.Errorf("set %.2f°C %.0fPa %.1f%%RH, read %.3f°C %.3fPa %.4f%%RH", tc, pa, rh, gotT, gotP, gotH)
				}
				n++
			}
		}
	}
	txs, bytes := bus.Counts()
	t.Logf("%d conversions; per Sense about %.1f transactions, %.1f bytes", n, float64(txs)/float64(n), float64(bytes)/float64(n))
}

func TestFaults(t *testing.T) {
	bus := chips.NewBus("emu")
	chip := chips.NewBME280()
	bus.Attach(0x76, chip)

	if _, err := NewI2C(bus, 0x77, nil); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "bme280 at 0x77: read chip id") {
		t.Errorf("no chip: %v", err)
	}
	chip.SetChipID(0x61)
	if _, err := NewI2C(bus, 0x76, nil); err == nil || !strings.Contains(err.Error(), "chip id 0x61") {
		t.Errorf("wrong id: %v", err)
	}
	chip.SetChipID(0x60)
	d, err := NewI2C(bus, 0x76, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSleep(d)
	var e physic.Env
	chip.FailBusy(3) // a slow conversion: polled until done
	if err := d.Sense(&e); err != nil || d.poll != 4 {
		t.Errorf("slow conversion: %v after %d polls, want success after 4", err, d.poll)
	}
	chip.FailBusy(50)
	if err := d.Sense(&e); !errors.Is(err, ErrBusy) {
		t.Errorf("stuck conversion: %v, want ErrBusy", err)
	}
	chip.FailBusy(0)
	chip.FailNACK(1)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "start conversion") {
		t.Errorf("NACK: %v", err)
	}
	bus.FailShortRead(1)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrShortRead) || !strings.Contains(err.Error(), "bme280 at 0x76: read data") {
		t.Errorf("short read: %v", err)
	}
	bus.SetStuck(true)
	if err := d.Sense(&e); !errors.Is(err, chips.ErrStuck) {
		t.Errorf("stuck bus: %v", err)
	}
	bus.SetStuck(false)
	if err := d.Sense(&e); err != nil {
		t.Errorf("after the faults: %v", err)
	}
	// A short read (the bus returned the reset values).
	pb := &i2ctest.Playback{Ops: []i2ctest.IO{
		{Addr: 0x76, W: []byte{0xF4, 0x25}}, {Addr: 0x76, W: []byte{0xF3}, R: []byte{0}},
		{Addr: 0x76, W: []byte{0xF7}, R: []byte{0x80, 0, 0, 0x80, 0, 0, 0x80, 0}},
	}, DontPanic: true}
	d.d.Bus = pb
	d.opts = Opts{Temperature: O1x, Pressure: O1x, Humidity: O1x}
	if err := d.Sense(&e); err == nil || !strings.Contains(err.Error(), "reset value") {
		t.Errorf("reset values: %v", err)
	}
}

// TestProbe identifies each chip by its id register, tells another chip
// from none, and leaves the chip as it was (no conversion started).
func TestProbe(t *testing.T) {
	bus := chips.NewBus("emu")
	bme, bmp := chips.NewBME280(), chips.NewBMP280()
	bus.Attach(Addr, bme)
	bus.Attach(AltAddr, bmp)
	if id, err := Probe(bus, Addr); err != nil || id != ChipIDBME280 {
		t.Errorf("BME280: id %#02x, %v", id, err)
	}
	if id, err := Probe(bus, AltAddr); err != nil || id != ChipIDBMP280 {
		t.Errorf("BMP280: id %#02x, %v", id, err)
	}
	if bme.Count() != 0 || bmp.Count() != 0 {
		t.Errorf("probing made conversions: %d, %d", bme.Count(), bmp.Count())
	}
	bme.SetChipID(0x61)
	if id, err := Probe(bus, Addr); id != 0x61 || !errors.Is(err, ErrWrongChip) || !strings.Contains(err.Error(), "bme280 at 0x76: chip id 0x61") {
		t.Errorf("another chip: id %#02x, %v", id, err)
	}
	bus.Detach(AltAddr)
	if _, err := Probe(bus, AltAddr); !errors.Is(err, chips.ErrNACK) || !strings.Contains(err.Error(), "bme280 at 0x77: read chip id") {
		t.Errorf("no chip: %v", err)
	}
}
