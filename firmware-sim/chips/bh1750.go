package chips

import (
	"fmt"
	"math"
	"sync"
)

// BH1750 is an instruction-level model of a ROHM BH1750FVI: power on/down,
// reset, the measurement-time register (written as two instructions),
// continuous and one-time modes in high resolution; a read returns the
// 16-bit count of the last measurement, big-endian.
type BH1750 struct {
	mu sync.Mutex
	faults
	lux     float64
	on      bool
	mt      uint8
	pending uint8 // MTreg high bits, until the low-bits instruction
	count   uint16
	// Measurements counts the measurements made.
	Measurements int
}

// NewBH1750 returns a powered-down sensor seeing 100 lx.
func NewBH1750() *BH1750 { return &BH1750{lux: 100, mt: 69} }

// Name implements Chip.
func (c *BH1750) Name() string { return "BH1750" }

// Set sets the illuminance the next measurement sees.
func (c *BH1750) Set(lux float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lux = lux
}

// FailNACK makes the sensor ignore its next n transactions.
func (c *BH1750) FailNACK(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults.FailNACK(n)
}

// Tx implements Chip.
func (c *BH1750) Tx(w, r []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.takeNACK() {
		return fmt.Errorf("%w from BH1750", ErrNACK)
	}
	for _, op := range w {
		switch {
		case op == 0x00:
			c.on = false
		case op == 0x01:
			c.on = true
		case op == 0x07:
			if !c.on {
				return fmt.Errorf("%w from BH1750: reset needs power on", ErrNACK)
			}
			c.count = 0
		case op&0xF8 == 0x40:
			c.pending = op & 7
		case op&0xE0 == 0x60:
			c.mt = c.pending<<5 | op&0x1F
		case op == 0x10 || op == 0x20: // high resolution, continuous or one-time
			if !c.on {
				return fmt.Errorf("%w from BH1750: measurement needs power on", ErrNACK)
			}
			c.Measurements++
			// count = lux * 1.2 * MTreg / 69 (datasheet p. 7, p. 11)
			c.count = uint16(min(math.Round(c.lux*1.2*float64(c.mt)/69), 65535))
			if op == 0x20 {
				c.on = false // one-time: powers down after
			}
		default:
			return fmt.Errorf("%w from BH1750: unknown instruction %#02x", ErrNACK, op)
		}
	}
	if len(r) > 0 {
		r[0] = byte(c.count >> 8)
		if len(r) > 1 {
			r[1] = byte(c.count)
		}
	}
	return nil
}
