// Package bh1750 drives the ROHM BH1750FVI ambient light sensor over I²C
// in one-time high-resolution mode: each Sense powers the sensor on,
// starts one measurement, waits for it and reads it; the sensor powers
// itself down afterwards.
//
// Reference: ROHM BH1750FVI datasheet, rev. D (2011), cited as page.
package bh1750

import (
	"fmt"
	"strconv"
	"time"

	"periph.io/x/conn/v3/i2c"
)

// Instructions (p. 5, "Instruction Set Architecture").
const (
	opPowerDown = 0x00
	opPowerOn   = 0x01
	opReset     = 0x07
	opOneTimeH  = 0x20 // one-time high-resolution mode (1 lx), then power down
)

// The sensor's I²C addresses (p. 10): pin ADDR low selects Addr, high
// AltAddr.
const (
	Addr    = 0x23
	AltAddr = 0x5C
)

// Probe checks for a sensor at addr on b. The BH1750 has no identification
// register: a device that acknowledges the power-on and power-down
// instructions (p. 5) at one of its addresses is taken for one, so Probe
// is only meaningful at Addr and AltAddr. It leaves the sensor powered
// down, and does not open or close the bus.
func Probe(b i2c.Bus, addr uint16) error {
	d := &Dev{d: &i2c.Dev{Bus: b, Addr: addr}}
	if err := d.op(opPowerOn); err != nil {
		return d.wrap("power on", err)
	}
	return d.Halt()
}

// Illuminance is in millilux.
type Illuminance int64

// Lux is one lux.
const Lux Illuminance = 1000

func (i Illuminance) String() string {
	return strconv.FormatFloat(float64(i)/float64(Lux), 'f', -1, 64) + "lx"
}

// Opts configures a Dev.
type Opts struct {
	// MTreg is the measurement time register (p. 11): 31…254, default 69.
	// Larger values measure longer and see dimmer light.
	MTreg uint8
}

// Dev is a BH1750 on an I²C bus.
type Dev struct {
	d     *i2c.Dev
	mt    uint8
	sleep func(time.Duration)
}

// NewI2C powers on the sensor at addr (Addr, or AltAddr with ADDR high) on b
// and sets its measurement time. It does not open or close the bus. The
// BH1750 has no identification register: a sensor that acknowledges these
// instructions is taken for one.
func NewI2C(b i2c.Bus, addr uint16, opts *Opts) (*Dev, error) {
	d := &Dev{d: &i2c.Dev{Bus: b, Addr: addr}, mt: 69, sleep: time.Sleep}
	if opts != nil && opts.MTreg != 0 {
		d.mt = opts.MTreg
	}
	if d.mt < 31 || d.mt > 254 {
		return nil, fmt.Errorf("bh1750 at %#02x: MTreg %d is out of range; use 31…254 (69 is the default)", addr, d.mt)
	}
	if err := d.op(opPowerOn); err != nil {
		return nil, d.wrap("power on", err)
	}
	// p. 11: MTreg is written as two instructions, high bits then low.
	if err := d.op(0x40 | d.mt>>5); err != nil {
		return nil, d.wrap("set measurement time", err)
	}
	if err := d.op(0x60 | d.mt&0x1F); err != nil {
		return nil, d.wrap("set measurement time", err)
	}
	return d, nil
}

func (d *Dev) String() string { return fmt.Sprintf("BH1750{%s}", d.d) }

// Halt powers the sensor down.
func (d *Dev) Halt() error { return d.wrap("power down", d.op(opPowerDown)) }

// MeasureTime is the maximum high-resolution measurement time for the
// configured MTreg: 180 ms at 69 (p. 2, electrical characteristics),
// proportional to MTreg.
func (d *Dev) MeasureTime() time.Duration {
	return 180 * time.Millisecond * time.Duration(d.mt) / 69
}

// Sense measures the illuminance. Bus transactions: two 1-byte writes
// (power on, one-time measurement) and one 2-byte read.
func (d *Dev) Sense() (Illuminance, error) {
	if err := d.op(opPowerOn); err != nil {
		return 0, d.wrap("power on", err)
	}
	if err := d.op(opOneTimeH); err != nil {
		return 0, d.wrap("start measurement", err)
	}
	d.sleep(d.MeasureTime())
	var b [2]byte
	if err := d.d.Tx(nil, b[:]); err != nil {
		return 0, d.wrap("read measurement", err)
	}
	raw := int64(b[0])<<8 | int64(b[1])
	// p. 7 and p. 11: lux = count / 1.2 at MTreg 69, scaled by 69/MTreg.
	return Illuminance(raw * int64(Lux) * 10 * 69 / (12 * int64(d.mt))), nil
}

func (d *Dev) op(o byte) error { return d.d.Tx([]byte{o}, nil) }

func (d *Dev) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bh1750 at %#02x: %s: %w", d.d.Addr, what, err)
}
