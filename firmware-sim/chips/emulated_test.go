package chips_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgegate/edgegate/firmware-sim/chips"
)

// TestEmulatedBus puts each driver's chip where asked, each answering as
// its chip does, and refuses a driver it has no chip for.
func TestEmulatedBus(t *testing.T) {
	bus, err := chips.EmulatedBus("emulated",
		chips.EmulatedChip{Driver: "bme280", Address: 0x77},
		chips.EmulatedChip{Driver: "sht3x", Address: 0x44},
		chips.EmulatedChip{Driver: "bh1750", Address: 0x23})
	if err != nil {
		t.Fatal(err)
	}
	if got := bus.Addrs(); !slices.Equal(got, []uint16{0x23, 0x44, 0x77}) || bus.String() != "emulated" {
		t.Errorf("bus %s holds %#x", bus, got)
	}
	var id [1]byte
	if err := bus.Tx(0x77, []byte{0xD0}, id[:]); err != nil || id[0] != 0x60 {
		t.Errorf("BME280 chip id %#02x, %v", id[0], err)
	}
	var st [3]byte // status 0x0010 (a reset seen), CRC 0xC2
	if err := bus.Tx(0x44, []byte{0xF3, 0x2D}, nil); err != nil {
		t.Error(err)
	}
	if err := bus.Tx(0x44, nil, st[:]); err != nil || st != [3]byte{0x00, 0x10, 0xC2} {
		t.Errorf("SHT3x status % x, %v", st, err)
	}
	if err := bus.Tx(0x23, []byte{0x01, 0x00}, nil); err != nil {
		t.Errorf("BH1750 power on, down: %v", err)
	}
	if _, err := chips.EmulatedBus("emulated", chips.EmulatedChip{Driver: "sht31", Address: 0x44}); err == nil || !strings.Contains(err.Error(), `no chip for driver "sht31" at 0x44`) {
		t.Errorf("unknown driver: %v", err)
	}
}
