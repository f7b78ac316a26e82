package chips

import (
	"fmt"
	"math"
)

// EmulatedChip is a chip for EmulatedBus: the name of the driver that reads
// it (bme280, sht3x or bh1750, as in the gateway's configuration) and its
// 7-bit address.
type EmulatedChip struct {
	Driver  string
	Address uint16
}

// EmulatedBus returns a bus named name with each chip attached, showing
// values for demos and for a gateway without hardware: a BME280 drifting
// slowly around 21 °C, 101325 Pa and 45 %RH (one step per conversion), an
// SHT3x at 20.5 °C and 48 %RH, a BH1750 seeing 320 lx. A driver it has no
// chip for is an error.
func EmulatedBus(name string, chips ...EmulatedChip) (*Bus, error) {
	bus := NewBus(name)
	for _, ec := range chips {
		var c Chip
		switch ec.Driver {
		case "bme280":
			b := NewBME280()
			b.Script(func(n int) (float64, float64, float64) {
				x := float64(n) / 30
				return 21 + 1.5*math.Sin(x), 101325 + 150*math.Cos(x/3), 45 + 5*math.Sin(x/2)
			})
			c = b
		case "sht3x":
			s := NewSHT3x()
			s.Set(20.5, 48)
			c = s
		case "bh1750":
			l := NewBH1750()
			l.Set(320)
			c = l
		default:
			return nil, fmt.Errorf("emulated bus %s: no chip for driver %q at %#02x; have bme280, sht3x and bh1750", name, ec.Driver, ec.Address)
		}
		bus.Attach(ec.Address, c)
	}
	return bus, nil
}
