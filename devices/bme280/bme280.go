// Package bme280 drives the Bosch BME280 (temperature, pressure, humidity)
// and BMP280 (temperature, pressure) over I²C, in forced mode: each Sense
// starts one conversion, waits for it, and compensates the raw values with
// the chip's calibration using the datasheet's integer formulas.
//
// References: Bosch BME280 datasheet BST-BME280-DS002 rev. 1.23 (cited as
// §section), and BMP280 datasheet BST-BMP280-DS001 rev. 1.26 for the
// BMP280's id and its worked compensation example (§3.12).
package bme280

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
)

// Registers (§5.3, table 18).
const (
	regCalib00  = 0x88 // dig_T1 … dig_H1: 0x88–0xA1
	regChipID   = 0xD0
	regReset    = 0xE0
	regCalib26  = 0xE1 // dig_H2 … dig_H6: 0xE1–0xE7
	regCtrlHum  = 0xF2
	regStatus   = 0xF3
	regCtrlMeas = 0xF4
	regConfig   = 0xF5
	regData     = 0xF7 // press_msb … hum_lsb: 0xF7–0xFE

	// ChipIDBME280 and ChipIDBMP280 are the values of register 0xD0
	// (§5.4.1; BMP280 datasheet §4.3.1).
	ChipIDBME280 = 0x60
	ChipIDBMP280 = 0x58

	resetWord     = 0xB6 // §5.4.2
	statusMeasure = 0x08 // §5.4.4: a conversion is running
	modeForced    = 0x01 // §5.4.5
)

// The chip's I²C addresses (§6.2): SDO to GND selects Addr, SDO to VDDIO
// AltAddr.
const (
	Addr    = 0x76
	AltAddr = 0x77
)

// ErrWrongChip is returned (wrapped) by Probe and NewI2C when the device
// at the address answers with a chip id that is neither a BME280's nor a
// BMP280's.
var ErrWrongChip = errors.New("another chip answers at this address")

// Probe identifies the chip at addr on b by its chip id register (§5.4.1;
// BMP280 datasheet §4.3.1), with one bus transaction and no change to the
// chip's state. It returns the id and a nil error for a BME280
// (ChipIDBME280) or a BMP280 (ChipIDBMP280); the id read and an error
// wrapping ErrWrongChip when another chip answers; or the bus error when
// nothing could be read. It does not open or close the bus.
func Probe(b i2c.Bus, addr uint16) (id byte, err error) {
	var r [1]byte
	if err := b.Tx(addr, []byte{regChipID}, r[:]); err != nil {
		return 0, fmt.Errorf("bme280 at %#02x: read chip id: %w", addr, err)
	}
	if r[0] != ChipIDBME280 && r[0] != ChipIDBMP280 {
		return r[0], fmt.Errorf("bme280 at %#02x: chip id %#02x, want %#02x (BME280) or %#02x (BMP280): %w",
			addr, r[0], ChipIDBME280, ChipIDBMP280, ErrWrongChip)
	}
	return r[0], nil
}

// Oversampling is a measurement's oversampling setting (§3.4, §5.4.3):
// more samples, less noise, longer conversions. Off skips the measurement.
type Oversampling uint8

// Oversampling settings, as the register encodes them.
const (
	Off Oversampling = iota
	O1x
	O2x
	O4x
	O8x
	O16x
)

func (o Oversampling) samples() int {
	if o == Off {
		return 0
	}
	return 1 << (o - 1)
}

// Opts configures a Dev. The zero value means 1x on every measurement.
type Opts struct {
	Temperature Oversampling
	Pressure    Oversampling
	Humidity    Oversampling // ignored on a BMP280
}

// Dev is a BME280 or BMP280 on an I²C bus.
type Dev struct {
	d     *i2c.Dev
	id    byte
	opts  Opts
	cal   calibration
	sleep func(time.Duration)
	poll  int // status reads made while waiting for the last conversion
}

// calibration holds the trimming parameters (§4.2.2, table 16).
type calibration struct {
	t1                             uint16
	t2, t3                         int16
	p1                             uint16
	p2, p3, p4, p5, p6, p7, p8, p9 int16
	h1, h3                         uint8
	h2, h4, h5                     int16
	h6                             int8
}

// NewI2C checks the chip at addr (Addr or AltAddr) on b with Probe, reads
// its calibration and returns a Dev. It does not open or close the bus.
func NewI2C(b i2c.Bus, addr uint16, opts *Opts) (*Dev, error) {
	d := &Dev{d: &i2c.Dev{Bus: b, Addr: addr}, sleep: time.Sleep}
	if opts != nil {
		d.opts = *opts
	}
	for _, o := range []*Oversampling{&d.opts.Temperature, &d.opts.Pressure, &d.opts.Humidity} {
		if *o == Off {
			*o = O1x
		}
		if *o > O16x {
			return nil, fmt.Errorf("bme280 at %#02x: oversampling %d is not a setting (Off … O16x)", addr, *o)
		}
	}
	id, err := Probe(b, addr)
	if err != nil {
		return nil, err
	}
	d.id = id
	var c1 [26]byte
	if err := d.d.Tx([]byte{regCalib00}, c1[:]); err != nil {
		return nil, d.wrap("read calibration", err)
	}
	var c2 [7]byte
	if d.id == ChipIDBME280 {
		if err := d.d.Tx([]byte{regCalib26}, c2[:]); err != nil {
			return nil, d.wrap("read humidity calibration", err)
		}
	}
	d.cal = parseCalibration(c1, c2)
	if d.cal.t1 == 0 || d.cal.p1 == 0 {
		return nil, fmt.Errorf("bme280 at %#02x: calibration reads as zero (dig_T1 %d, dig_P1 %d): the chip's NVM did not load", addr, d.cal.t1, d.cal.p1)
	}
	// §5.4.3: ctrl_hum takes effect with the next write of ctrl_meas (the
	// BMP280 has no such register); the config register sets no filter
	// (§3.4.4), and standby is unused in forced mode. A write is pairs of
	// register and value (§6.2.1).
	w := []byte{regConfig, 0}
	if d.id == ChipIDBME280 {
		w = append(w, regCtrlHum, byte(d.opts.Humidity))
	}
	if err := d.d.Tx(w, nil); err != nil {
		return nil, d.wrap("configure", err)
	}
	return d, nil
}

// parseCalibration decodes the trimming parameters (§4.2.2, table 16):
// little-endian words, with dig_H4 and dig_H5 sharing register 0xE5's
// nibbles.
func parseCalibration(c1 [26]byte, c2 [7]byte) calibration {
	u := func(i int) uint16 { return binary.LittleEndian.Uint16(c1[i:]) }
	s := func(i int) int16 { return int16(u(i)) }
	return calibration{
		t1: u(0), t2: s(2), t3: s(4),
		p1: u(6), p2: s(8), p3: s(10), p4: s(12), p5: s(14), p6: s(16), p7: s(18), p8: s(20), p9: s(22),
		h1: c1[25],
		h2: int16(binary.LittleEndian.Uint16(c2[0:])),
		h3: c2[2],
		h4: int16(int8(c2[3]))<<4 | int16(c2[4]&0x0F), // 0xE4[7:0] / 0xE5[3:0], signed 12 bits
		h5: int16(int8(c2[5]))<<4 | int16(c2[4]>>4),   // 0xE6[7:0] / 0xE5[7:4]
		h6: int8(c2[6]),
	}
}

// String names the chip and its address.
func (d *Dev) String() string {
	name := "BME280"
	if d.id == ChipIDBMP280 {
		name = "BMP280"
	}
	return fmt.Sprintf("%s{%s}", name, d.d)
}

// Humidity reports whether the chip measures humidity (a BME280).
func (d *Dev) Humidity() bool { return d.id == ChipIDBME280 }

// Halt puts the chip in sleep mode; a later Sense wakes it.
func (d *Dev) Halt() error {
	return d.wrap("sleep", d.d.Tx([]byte{regCtrlMeas, 0}, nil))
}

// Reset is the chip's soft reset (§5.4.2); the calibration stays valid.
func (d *Dev) Reset() error {
	return d.wrap("reset", d.d.Tx([]byte{regReset, resetWord}, nil))
}

// MeasureTime is how long a conversion with these settings may take at
// most (§9.1, appendix B).
func (o Opts) MeasureTime() time.Duration {
	us := 1250 + 2300*o.Temperature.samples()
	if o.Pressure.samples() > 0 {
		us += 2300*o.Pressure.samples() + 575
	}
	if o.Humidity.samples() > 0 {
		us += 2300*o.Humidity.samples() + 575
	}
	return time.Duration(us) * time.Microsecond
}

// ErrBusy is returned when a conversion has not finished long after it
// should have.
var ErrBusy = errors.New("conversion did not finish")

// Sense runs one forced-mode conversion and returns temperature, pressure
// and (on a BME280) humidity. Bus transactions: one write to start, a
// status read per poll (usually one), one 8-byte burst read (6 on a BMP280).
func (d *Dev) Sense(e *physic.Env) error {
	ctrl := byte(d.opts.Temperature)<<5 | byte(d.opts.Pressure)<<2 | modeForced
	if err := d.d.Tx([]byte{regCtrlMeas, ctrl}, nil); err != nil {
		return d.wrap("start conversion", err)
	}
	wait := d.opts.MeasureTime()
	d.sleep(wait)
	var st [1]byte
	d.poll = 0
	for {
		if err := d.d.Tx([]byte{regStatus}, st[:]); err != nil {
			return d.wrap("read status", err)
		}
		d.poll++
		if st[0]&statusMeasure == 0 {
			break
		}
		if d.poll >= 10 {
			return d.wrap("wait for conversion", fmt.Errorf("%w: still measuring %v after the datasheet's maximum", ErrBusy, time.Duration(d.poll)*wait))
		}
		d.sleep(wait)
	}
	n := 8
	if d.id == ChipIDBMP280 {
		n = 6
	}
	var raw [8]byte
	if err := d.d.Tx([]byte{regData}, raw[:n]); err != nil {
		return d.wrap("read data", err)
	}
	adcP := int32(raw[0])<<12 | int32(raw[1])<<4 | int32(raw[2])>>4
	adcT := int32(raw[3])<<12 | int32(raw[4])<<4 | int32(raw[5])>>4
	if adcT == 0x80000 || adcP == 0x80000 {
		// §4.2.1 (data readout): 0x80000 means the measurement was skipped,
		// which forced mode with oversampling on never does: the bus
		// returned the reset value.
		return d.wrap("read data", errors.New("temperature or pressure reads 0x80000 (the reset value): no conversion happened"))
	}
	t, tFine := d.cal.compensateT(adcT)
	e.Temperature = physic.Temperature(t)*10*physic.MilliKelvin + physic.ZeroCelsius
	e.Pressure = physic.Pressure(d.cal.compensateP(adcP, tFine)) * physic.Pascal / 256
	e.Humidity = 0
	if d.id == ChipIDBME280 {
		adcH := int32(raw[6])<<8 | int32(raw[7])
		if adcH == 0x8000 {
			return d.wrap("read data", errors.New("humidity reads 0x8000 (the reset value): no conversion happened"))
		}
		e.Humidity = physic.RelativeHumidity(int64(d.cal.compensateH(adcH, tFine)) * int64(physic.PercentRH) / 1024)
	}
	return nil
}

func (d *Dev) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bme280 at %#02x: %s: %w", d.d.Addr, what, err)
}

// compensateT is BME280_compensate_T_int32 (§4.2.3, §8.2): temperature in
// 0.01 °C, and t_fine for the other two.
func (c *calibration) compensateT(adcT int32) (t, tFine int32) {
	var1 := ((adcT>>3 - int32(c.t1)<<1) * int32(c.t2)) >> 11
	x := adcT>>4 - int32(c.t1)
	var2 := (((x * x) >> 12) * int32(c.t3)) >> 14
	tFine = var1 + var2
	return (tFine*5 + 128) >> 8, tFine
}

// compensateP is BME280_compensate_P_int64 (§4.2.3, §8.2): pressure in Pa
// as Q24.8.
func (c *calibration) compensateP(adcP, tFine int32) uint32 {
	var1 := int64(tFine) - 128000
	var2 := var1 * var1 * int64(c.p6)
	var2 += (var1 * int64(c.p5)) << 17
	var2 += int64(c.p4) << 35
	var1 = (var1*var1*int64(c.p3))>>8 + (var1*int64(c.p2))<<12
	var1 = ((int64(1)<<47 + var1) * int64(c.p1)) >> 33
	if var1 == 0 {
		return 0 // §8.2: avoid a division by zero
	}
	p := int64(1048576 - adcP)
	p = ((p<<31 - var2) * 3125) / var1
	var1 = (int64(c.p9) * (p >> 13) * (p >> 13)) >> 25
	var2 = (int64(c.p8) * p) >> 19
	return uint32((p+var1+var2)>>8 + int64(c.p7)<<4)
}

// compensateH is bme280_compensate_H_int32 (§4.2.3, §8.2): relative
// humidity in % as Q22.10, clamped to 0…100 %.
func (c *calibration) compensateH(adcH, tFine int32) uint32 {
	v := tFine - 76800
	v = (((adcH<<14 - int32(c.h4)<<20 - int32(c.h5)*v) + 16384) >> 15) *
		(((((((v*int32(c.h6))>>10)*(((v*int32(c.h3))>>11)+32768))>>10)+2097152)*int32(c.h2) + 8192) >> 14)
	v -= ((((v >> 15) * (v >> 15)) >> 7) * int32(c.h1)) >> 4
	v = max(v, 0)
	v = min(v, 419430400)
	return uint32(v >> 12)
}
