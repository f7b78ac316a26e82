package chips

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// BME280 is a register-level model of a Bosch BME280 (or, made with
// NewBMP280, a BMP280): chip id, calibration NVM, ctrl registers, forced
// and normal mode, status, and data registers with auto-increment on read.
// Setting physical values makes a conversion produce the raw ADC values
// that the datasheet's compensation (its double-precision version, §8.1,
// written here independently of any driver) turns back into them.
type BME280 struct {
	mu sync.Mutex
	faults
	regs  [256]byte
	ptr   byte
	bmp   bool
	tempC float64
	pa    float64
	rh    float64
	cal   bmeCal
	// Conversions counts the measurements made.
	Conversions int
	script      func(n int) (celsius, pascal, percentRH float64)
}

// Script makes conversion n (from 0) measure what f returns, instead of
// the values given to Set.
func (c *BME280) Script(f func(n int) (celsius, pascal, percentRH float64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.script = f
}

type bmeCal struct {
	t1                             uint16
	t2, t3                         int16
	p1                             uint16
	p2, p3, p4, p5, p6, p7, p8, p9 int16
	h1, h3                         uint8
	h2, h4, h5                     int16
	h6                             int8
}

// exampleCal is the BMP280 datasheet's worked example (§3.12) for
// temperature and pressure, and humidity values typical of real BME280s.
var exampleCal = bmeCal{t1: 27504, t2: 26435, t3: -1000,
	p1: 36477, p2: -10685, p3: 3024, p4: 2855, p5: 140, p6: -7, p7: 15500, p8: -14600, p9: 6000,
	h1: 75, h2: 362, h3: 0, h4: 313, h5: 50, h6: 30}

// NewBME280 returns a BME280 at 20 °C, 101325 Pa, 50 %RH.
func NewBME280() *BME280 { return newBME(false) }

// NewBMP280 returns a BMP280 (no humidity) at 20 °C, 101325 Pa.
func NewBMP280() *BME280 { return newBME(true) }

func newBME(bmp bool) *BME280 {
	c := &BME280{bmp: bmp, tempC: 20, pa: 101325, rh: 50, cal: exampleCal}
	c.reset()
	k := c.cal
	var nvm [26]byte
	for i, v := range []uint16{k.t1, uint16(k.t2), uint16(k.t3), k.p1, uint16(k.p2), uint16(k.p3), uint16(k.p4),
		uint16(k.p5), uint16(k.p6), uint16(k.p7), uint16(k.p8), uint16(k.p9)} {
		binary.LittleEndian.PutUint16(nvm[2*i:], v)
	}
	copy(c.regs[0x88:], nvm[:24])
	c.regs[0xD0] = 0x60
	if bmp {
		c.regs[0xD0] = 0x58
		return c
	}
	c.regs[0xA1] = k.h1
	binary.LittleEndian.PutUint16(c.regs[0xE1:], uint16(k.h2))
	c.regs[0xE3] = k.h3
	c.regs[0xE4] = byte(k.h4 >> 4)                      // dig_H4[11:4]
	c.regs[0xE5] = byte(k.h5&0x0F)<<4 | byte(k.h4&0x0F) // dig_H5[3:0], dig_H4[3:0]
	c.regs[0xE6] = byte(k.h5 >> 4)                      // dig_H5[11:4]
	c.regs[0xE7] = byte(k.h6)
	return c
}

// reset sets the control and data registers to their reset values (§5.3).
func (c *BME280) reset() {
	for r := 0xF2; r <= 0xF5; r++ {
		c.regs[r] = 0
	}
	copy(c.regs[0xF7:], []byte{0x80, 0, 0, 0x80, 0, 0, 0x80, 0})
}

// Name implements Chip.
func (c *BME280) Name() string {
	if c.bmp {
		return "BMP280"
	}
	return "BME280"
}

// Set sets the physical values the next conversion measures. Humidity is
// ignored by a BMP280.
func (c *BME280) Set(celsius, pascal, percentRH float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tempC, c.pa, c.rh = celsius, pascal, percentRH
}

// SetChipID overwrites the id register (to model another chip).
func (c *BME280) SetChipID(id byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.regs[0xD0] = id
}

// FailNACK makes the chip ignore its next n transactions.
func (c *BME280) FailNACK(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults.FailNACK(n)
}

// FailBusy makes the next conversion report "measuring" for n extra
// status reads.
func (c *BME280) FailBusy(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults.FailBusy(n)
}

// Tx implements Chip: a write is register/value pairs (§6.2.1), a read
// sets the register pointer and reads with auto-increment (§6.2.2).
func (c *BME280) Tx(w, r []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.takeNACK() {
		return fmt.Errorf("%w from %s", ErrNACK, c.Name())
	}
	if len(r) > 0 {
		if len(w) != 1 {
			return fmt.Errorf("%s: a read must write exactly the register address, got %d bytes", c.Name(), len(w))
		}
		c.ptr = w[0]
		for i := range r {
			r[i] = c.read(c.ptr)
			c.ptr++
		}
		return nil
	}
	if len(w)%2 != 0 {
		return fmt.Errorf("%s: a write is register/value pairs, got %d bytes", c.Name(), len(w))
	}
	for i := 0; i < len(w); i += 2 {
		c.write(w[i], w[i+1])
	}
	return nil
}

func (c *BME280) read(reg byte) byte {
	if reg == 0xF3 && c.busy > 0 { // status: still measuring
		c.busy--
		return 0x08
	}
	if c.bmp && (reg == 0xF2 || reg >= 0xFD || reg >= 0xA1 && reg < 0xD0 || reg >= 0xE1 && reg <= 0xE7) {
		return 0 // no humidity on a BMP280
	}
	return c.regs[reg]
}

func (c *BME280) write(reg, v byte) {
	switch reg {
	case 0xE0:
		if v == 0xB6 {
			c.reset()
		}
	case 0xF2, 0xF5:
		c.regs[reg] = v
	case 0xF4:
		c.regs[reg] = v
		if mode := v & 3; mode == 1 || mode == 2 || mode == 3 {
			c.convert(v)
			if mode != 3 {
				c.regs[0xF4] = v &^ 3 // forced: back to sleep when done
			}
		}
	}
}

// convert makes one measurement with the oversampling in ctrl_meas (and
// ctrl_hum): skipped measurements read 0x80000 / 0x8000 (§4.2.1).
func (c *BME280) convert(ctrlMeas byte) {
	if c.script != nil {
		c.tempC, c.pa, c.rh = c.script(c.Conversions)
	}
	c.Conversions++
	adcT := c.adcT(c.tempC)
	tFine := c.cal.tFine(float64(adcT))
	if ctrlMeas>>5 == 0 {
		adcT = 0x80000
	}
	adcP := int32(0x80000)
	if (ctrlMeas>>2)&7 != 0 {
		adcP = c.adcP(c.pa, tFine)
	}
	put20 := func(at int, v int32) {
		c.regs[at], c.regs[at+1], c.regs[at+2] = byte(v>>12), byte(v>>4), byte(v<<4)
	}
	put20(0xF7, adcP)
	put20(0xFA, adcT)
	adcH := int32(0x8000)
	if !c.bmp && c.regs[0xF2]&7 != 0 {
		adcH = c.adcH(c.rh, tFine)
	}
	c.regs[0xFD], c.regs[0xFE] = byte(adcH>>8), byte(adcH)
}

// search returns the x in [0, n) whose f(x) is nearest target, for f
// monotonic (increasing or decreasing).
func search(n int32, f func(int32) float64, target float64) int32 {
	inc := f(n-1) > f(0)
	lo, hi := int32(0), n-1
	for lo < hi {
		mid := (lo + hi) / 2
		if v := f(mid); (v < target) == inc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo > 0 && math.Abs(f(lo-1)-target) < math.Abs(f(lo)-target) {
		lo--
	}
	return lo
}

func (c *BME280) adcT(celsius float64) int32 {
	return search(1<<20, func(a int32) float64 { return c.cal.tFine(float64(a)) / 5120 }, celsius)
}

func (c *BME280) adcP(pa, tFine float64) int32 {
	return search(1<<20, func(a int32) float64 { return c.cal.pressure(float64(a), tFine) }, pa)
}

func (c *BME280) adcH(rh, tFine float64) int32 {
	return search(1<<16, func(a int32) float64 { return c.cal.humidity(float64(a), tFine) }, rh)
}

// The datasheet's double-precision compensation (§8.1).

func (k bmeCal) tFine(adcT float64) float64 {
	v1 := (adcT/16384 - float64(k.t1)/1024) * float64(k.t2)
	x := adcT/131072 - float64(k.t1)/8192
	return v1 + x*x*float64(k.t3)
}

func (k bmeCal) pressure(adcP, tFine float64) float64 {
	v1 := tFine/2 - 64000
	v2 := v1 * v1 * float64(k.p6) / 32768
	v2 += v1 * float64(k.p5) * 2
	v2 = v2/4 + float64(k.p4)*65536
	v1 = (float64(k.p3)*v1*v1/524288 + float64(k.p2)*v1) / 524288
	v1 = (1 + v1/32768) * float64(k.p1)
	if v1 == 0 {
		return 0
	}
	p := 1048576 - adcP
	p = (p - v2/4096) * 6250 / v1
	v1 = float64(k.p9) * p * p / 2147483648
	v2 = p * float64(k.p8) / 32768
	return p + (v1+v2+float64(k.p7))/16
}

func (k bmeCal) humidity(adcH, tFine float64) float64 {
	h := tFine - 76800
	h = (adcH - (float64(k.h4)*64 + float64(k.h5)/16384*h)) *
		(float64(k.h2) / 65536 * (1 + float64(k.h6)/67108864*h*(1+float64(k.h3)/67108864*h)))
	h *= 1 - float64(k.h1)*h/524288
	return min(max(h, 0), 100)
}
