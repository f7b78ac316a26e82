// Package sht3x drives the Sensirion SHT30/SHT31/SHT35 humidity and
// temperature sensors over I²C in single-shot mode with clock stretching
// disabled: each Sense sends a measurement command, waits the datasheet's
// maximum measurement time, and reads the result, checking the CRC of
// every word.
//
// Reference: Sensirion SHT3x-DIS datasheet, version 7 (December 2022),
// cited as §section.
package sht3x

import (
	"errors"
	"fmt"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
)

// Commands (§4.3, §4.8, §4.9, §4.11, table 9 …).
const (
	cmdSoftReset   = 0x30A2 // §4.9
	cmdReadStatus  = 0xF32D // §4.11
	cmdClearStatus = 0x3041
)

// The sensor's I²C addresses (the datasheet's table of I²C device
// addresses): pin ADDR low selects Addr, high AltAddr.
const (
	Addr    = 0x44
	AltAddr = 0x45
)

// Probe identifies the sensor at addr on b: it reads the status register
// (§4.11) and checks the word's CRC (§4.12), which a chip that merely
// acknowledges does not get right. It returns the status word, or an error
// (wrapping ErrCRC for a wrong checksum) when nothing or something else
// answered. Unlike NewI2C it does not reset the sensor, and it does not
// open or close the bus.
func Probe(b i2c.Bus, addr uint16) (status uint16, err error) {
	d := &Dev{d: &i2c.Dev{Bus: b, Addr: addr}}
	return d.Status()
}

// Repeatability trades measurement time for noise (§4.3, table 9).
type Repeatability uint8

// Repeatability settings.
const (
	High Repeatability = iota
	Medium
	Low
)

// command is the single-shot command without clock stretching and its
// maximum duration (§2.2 table 4, §4.3 table 9).
func (r Repeatability) command() (uint16, time.Duration) {
	switch r {
	case Medium:
		return 0x240B, 6500 * time.Microsecond
	case Low:
		return 0x2416, 4500 * time.Microsecond
	}
	return 0x2400, 15500 * time.Microsecond
}

// Opts configures a Dev.
type Opts struct {
	Repeatability Repeatability
}

// Dev is an SHT3x on an I²C bus.
type Dev struct {
	d     *i2c.Dev
	opts  Opts
	sleep func(time.Duration)
}

// ErrCRC is returned when a word's checksum does not match.
var ErrCRC = errors.New("CRC mismatch")

// NewI2C resets the sensor at addr (Addr or AltAddr) on b and checks that it
// answers with a status word whose CRC is right. It does not open or close
// the bus.
func NewI2C(b i2c.Bus, addr uint16, opts *Opts) (*Dev, error) {
	d := &Dev{d: &i2c.Dev{Bus: b, Addr: addr}, sleep: time.Sleep}
	if opts != nil {
		d.opts = *opts
	}
	if d.opts.Repeatability > Low {
		return nil, fmt.Errorf("sht3x at %#02x: repeatability %d is not a setting (High, Medium, Low)", addr, d.opts.Repeatability)
	}
	if err := d.Reset(); err != nil {
		return nil, err
	}
	if _, err := d.Status(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Dev) String() string { return fmt.Sprintf("SHT3x{%s}", d.d) }

// Reset is the soft reset (§4.9); the sensor is ready 1.5 ms later.
func (d *Dev) Reset() error {
	if err := d.command(cmdSoftReset); err != nil {
		return d.wrap("soft reset", err)
	}
	d.sleep(1500 * time.Microsecond)
	return nil
}

// Halt does nothing: in single-shot mode the sensor idles between
// measurements.
func (d *Dev) Halt() error { return nil }

// Status reads the status register (§4.11, table 17).
func (d *Dev) Status() (uint16, error) {
	if err := d.command(cmdReadStatus); err != nil {
		return 0, d.wrap("read status", err)
	}
	var b [3]byte
	if err := d.d.Tx(nil, b[:]); err != nil {
		return 0, d.wrap("read status", err)
	}
	v, err := word(b[:])
	if err != nil {
		return 0, d.wrap("status", err)
	}
	return v, nil
}

// ClearStatus clears the status register's alert flags.
func (d *Dev) ClearStatus() error { return d.wrap("clear status", d.command(cmdClearStatus)) }

// Sense measures temperature and relative humidity (pressure is left
// zero). Bus transactions: one 2-byte write and one 6-byte read (more reads
// if the sensor is still measuring and NACKs, §4.4).
func (d *Dev) Sense(e *physic.Env) error {
	cmd, wait := d.opts.Repeatability.command()
	if err := d.command(cmd); err != nil {
		return d.wrap("start measurement", err)
	}
	var b [6]byte
	var first error
	const tries = 4
	for try := 0; ; try++ {
		d.sleep(wait)
		err := d.d.Tx(nil, b[:])
		if err == nil {
			break
		}
		// §4.4: without clock stretching, the sensor NACKs the read
		// header until the measurement is done: read again. The first
		// failure is the one reported.
		if first == nil {
			first = err
		}
		if try == tries-1 {
			return d.wrap("read measurement", fmt.Errorf("%w (and %d more reads failed)", first, tries-1))
		}
	}
	st, err := word(b[0:3])
	if err != nil {
		return d.wrap("temperature", err)
	}
	srh, err := word(b[3:6])
	if err != nil {
		return d.wrap("humidity", err)
	}
	// §4.13: T = -45 + 175 * S_T / (2^16 - 1), RH = 100 * S_RH / (2^16 - 1).
	e.Temperature = physic.ZeroCelsius - 45*physic.Celsius + physic.Temperature(int64(st)*int64(175*physic.Celsius)/65535)
	e.Humidity = physic.RelativeHumidity(int64(srh) * int64(100*physic.PercentRH) / 65535)
	e.Pressure = 0
	return nil
}

func (d *Dev) command(c uint16) error { return d.d.Tx([]byte{byte(c >> 8), byte(c)}, nil) }

func (d *Dev) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sht3x at %#02x: %s: %w", d.d.Addr, what, err)
}

// word checks and returns a 16-bit word followed by its CRC.
func word(b []byte) (uint16, error) {
	if c := CRC8(b[:2]); c != b[2] {
		return 0, fmt.Errorf("%w: word %#04x has CRC %#02x, computed %#02x", ErrCRC, uint16(b[0])<<8|uint16(b[1]), b[2], c)
	}
	return uint16(b[0])<<8 | uint16(b[1]), nil
}

// CRC8 is the checksum of §4.12 (table 20): polynomial 0x31
// (x^8 + x^5 + x^4 + 1), initial value 0xFF, no reflection, no final XOR.
// CRC8([]byte{0xBE, 0xEF}) is 0x92.
func CRC8(b []byte) byte {
	crc := byte(0xFF)
	for _, v := range b {
		crc ^= v
		for range 8 {
			if crc&0x80 != 0 {
				crc = crc<<1 ^ 0x31
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
