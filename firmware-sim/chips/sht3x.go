package chips

import (
	"fmt"
	"math"
	"sync"
)

// SHT3x is a command-level model of a Sensirion SHT3x (datasheet v7):
// single-shot measurements (any repeatability, clock stretching off: a
// read before the result is ready is not acknowledged, §4.4), soft reset,
// status register, and the CRC-8 of every word (§4.12).
type SHT3x struct {
	mu sync.Mutex
	faults
	tempC, rh float64
	pending   int    // reads to NACK before the measurement is ready
	out       []byte // what the next read returns
	status    uint16
	badCRC    int
	// Measurements counts the measurements made.
	Measurements int
}

// NewSHT3x returns a sensor at 20 °C and 50 %RH, its status showing a
// reset (bit 4), as after power-up.
func NewSHT3x() *SHT3x { return &SHT3x{tempC: 20, rh: 50, status: 1 << 4} }

// Name implements Chip.
func (c *SHT3x) Name() string { return "SHT3x" }

// Set sets what the next measurement finds.
func (c *SHT3x) Set(celsius, percentRH float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tempC, c.rh = celsius, percentRH
}

// FailNACK makes the sensor ignore its next n transactions.
func (c *SHT3x) FailNACK(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults.FailNACK(n)
}

// FailBusy makes the next measurement take n more reads (NACKed) to be
// ready.
func (c *SHT3x) FailBusy(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults.FailBusy(n)
}

// FailCRC corrupts the checksums of the next n reads.
func (c *SHT3x) FailCRC(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.badCRC = n
}

func crc8(b []byte) byte {
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

func appendWord(b []byte, w uint16) []byte {
	b = append(b, byte(w>>8), byte(w))
	return append(b, crc8(b[len(b)-2:]))
}

// Tx implements Chip: a write is a 16-bit command, a read returns the
// result of the last one.
func (c *SHT3x) Tx(w, r []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.takeNACK() {
		return fmt.Errorf("%w from SHT3x", ErrNACK)
	}
	if len(w) > 0 {
		if len(w) != 2 || len(r) > 0 {
			return fmt.Errorf("%w from SHT3x: commands are 2 bytes, written alone", ErrNACK)
		}
		return c.command(uint16(w[0])<<8 | uint16(w[1]))
	}
	if c.pending > 0 {
		c.pending--
		return fmt.Errorf("%w from SHT3x (measuring)", ErrNACK)
	}
	if len(c.out) == 0 {
		return fmt.Errorf("%w from SHT3x: nothing to read", ErrNACK)
	}
	n := copy(r, c.out)
	if c.badCRC > 0 {
		c.badCRC--
		r[min(n, 3)-1] ^= 0x5A
	}
	c.out = nil
	return nil
}

func (c *SHT3x) command(cmd uint16) error {
	switch cmd {
	case 0x2400, 0x240B, 0x2416, 0x2C06, 0x2C0D, 0x2C10: // single shot (§4.3, table 9)
		c.Measurements++
		st := uint16(math.Round(min(max((c.tempC+45)/175, 0), 1) * 65535))
		srh := uint16(math.Round(min(max(c.rh/100, 0), 1) * 65535))
		c.out = appendWord(appendWord(nil, st), srh)
		c.pending = c.busy
		c.busy = 0
	case 0x30A2: // soft reset
		c.out, c.pending, c.status = nil, 0, 1<<4
	case 0xF32D: // read status
		c.out = appendWord(nil, c.status)
	case 0x3041: // clear status
		c.status &^= 1<<15 | 1<<11 | 1<<10 | 1<<4
	default:
		c.status |= 1 << 1 // command not processed (§4.11, table 17)
		return fmt.Errorf("%w from SHT3x: unknown command %#04x", ErrNACK, cmd)
	}
	return nil
}
