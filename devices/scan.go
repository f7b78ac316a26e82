package devices

import (
	"slices"

	"periph.io/x/conn/v3/i2c"
)

// Found is a device that answered a Scan.
type Found struct {
	Addr uint16 // 7-bit
	What string // what identified it, or "unknown device"
}

// Scan lists, in address order, the devices on bus at the usable 7-bit
// addresses 0x03…0x77. At a driver's address it asks the driver's Probe
// first (the first driver with something to say wins); any other device
// is one that acknowledges a one-byte read, as i2cdetect -r finds it, and
// is listed as "unknown device". Scan makes one to a few transactions per
// address and leaves the chips it identifies idle; it does not close the
// bus.
func Scan(bus i2c.Bus) []Found {
	var out []Found
	for addr := uint16(0x03); addr <= 0x77; addr++ {
		what := identify(bus, addr)
		if what == "" {
			if bus.Tx(addr, nil, make([]byte, 1)) != nil {
				continue
			}
			what = "unknown device"
		}
		out = append(out, Found{addr, what})
	}
	return out
}

func identify(bus i2c.Bus, addr uint16) string {
	for _, d := range drivers {
		if !slices.Contains(d.Addresses, addr) {
			continue
		}
		if what, _ := d.Probe(bus, addr); what != "" {
			return what
		}
	}
	return ""
}
