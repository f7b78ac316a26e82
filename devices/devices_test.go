package devices_test

import (
	"math"
	"slices"
	"testing"

	"github.com/edgegate/edgegate/devices"
	"github.com/edgegate/edgegate/firmware-sim/chips"
)

// emulators builds each driver's chip in firmware-sim.
var emulators = map[string]func() chips.Chip{
	"bme280": func() chips.Chip { return chips.NewBME280() },
	"sht3x":  func() chips.Chip { return chips.NewSHT3x() },
	"bh1750": func() chips.Chip { return chips.NewBH1750() },
}

// TestTable checks every driver against its emulated chip at each of its
// addresses: Probe finds it, the other drivers' Probes do not take it for
// theirs (on the emulators; a real chip may acknowledge a BH1750's
// instructions, which is why Scan asks a driver only at its own
// addresses), and an opened Sensor reads the driver's metrics with their
// units.
func TestTable(t *testing.T) {
	ds := devices.Drivers()
	if len(ds) != len(emulators) {
		t.Fatalf("%d drivers, %d emulators", len(ds), len(emulators))
	}
	for _, d := range ds {
		t.Run(d.Name, func(t *testing.T) {
			if got, ok := devices.Lookup(d.Name); !ok || got.Name != d.Name {
				t.Errorf("Lookup(%q) = %v, %v", d.Name, got.Name, ok)
			}
			if len(d.Chips) == 0 || len(d.Metrics) == 0 || len(d.Addresses) == 0 {
				t.Fatalf("incomplete entry: %+v", d)
			}
			for _, addr := range d.Addresses {
				bus := chips.NewBus("emu")
				bus.Attach(addr, emulators[d.Name]())
				if what, ok := d.Probe(bus, addr); !ok || what == "" {
					t.Errorf("Probe at %#02x: %q, %v", addr, what, ok)
				}
				for _, other := range ds {
					if other.Name == d.Name {
						continue
					}
					if what, ok := other.Probe(bus, addr); ok {
						t.Errorf("%s's Probe took the %s at %#02x for its own: %q", other.Name, d.Name, addr, what)
					}
				}
				s, err := d.Open(bus, addr)
				if err != nil {
					t.Fatalf("Open at %#02x: %v", addr, err)
				}
				vals, err := s.Read()
				if err != nil {
					t.Fatal(err)
				}
				var got []devices.Metric
				for _, v := range vals {
					got = append(got, devices.Metric{Name: v.Metric, Unit: v.Unit})
				}
				if !slices.Equal(got, d.Metrics) {
					t.Errorf("read %v, want the metrics %v", got, d.Metrics)
				}
				if err := s.Halt(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	if _, ok := devices.Lookup("sht31"); ok {
		t.Error("Lookup found a driver that is not in the table")
	}
}

// TestRead checks the values and their conversion to plain units, and
// that a BMP280 reports no humidity.
func TestRead(t *testing.T) {
	bus := chips.NewBus("emu")
	bme, bmp, sht, bh := chips.NewBME280(), chips.NewBMP280(), chips.NewSHT3x(), chips.NewBH1750()
	bme.Set(21.5, 100250, 40)
	bmp.Set(-5, 95000, 80)
	sht.Set(18.5, 60)
	bh.Set(250)
	bus.Attach(0x76, bme)
	bus.Attach(0x77, bmp)
	bus.Attach(0x45, sht)
	bus.Attach(0x5C, bh)
	for _, tc := range []struct {
		driver string
		addr   uint16
		want   []float64
		within float64
	}{
		{"bme280", 0x76, []float64{21.5, 100250, 40}, 0.5},
		{"bme280", 0x77, []float64{-5, 95000}, 0.5},
		{"sht3x", 0x45, []float64{18.5, 60}, 0.01},
		{"bh1750", 0x5C, []float64{250}, 1},
	} {
		d, _ := devices.Lookup(tc.driver)
		s, err := d.Open(bus, tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := s.Read()
		if err != nil {
			t.Fatal(err)
		}
		if len(vals) != len(tc.want) {
			t.Errorf("%s at %#02x: %v, want %v", tc.driver, tc.addr, vals, tc.want)
			continue
		}
		for i, v := range vals {
			if math.Abs(v.V-tc.want[i]) > tc.within {
				t.Errorf("%s at %#02x: %s = %g %s, want %g", tc.driver, tc.addr, v.Metric, v.V, v.Unit, tc.want[i])
			}
		}
	}
}

// TestScan lists a bus the way edgegate sensors scan prints it: chips
// identified by their drivers, a BME280 address holding another chip by
// its id register, and a device no driver knows.
func TestScan(t *testing.T) {
	bus := chips.NewBus("emu")
	other := chips.NewBME280()
	other.SetChipID(0x61)
	bus.Attach(0x76, chips.NewBME280())
	bus.Attach(0x77, other)
	bus.Attach(0x44, chips.NewSHT3x())
	bus.Attach(0x23, chips.NewBH1750())
	bus.Attach(0x30, chips.NewBH1750()) // not at a BH1750 address
	bus.Attach(0x5C, chips.NewSHT3x())  // at a BH1750 address, refusing its instructions and one-byte reads: not listed
	want := []devices.Found{
		{Addr: 0x23, What: "BH1750 (no id register: by address and power-on)"},
		{Addr: 0x30, What: "unknown device"},
		{Addr: 0x44, What: "SHT3x (status 0x0010, CRC ok)"},
		{Addr: 0x76, What: "BME280 (chip id 0x60)"},
		{Addr: 0x77, What: "unknown device (register 0xD0 = 0x61)"},
	}
	if got := devices.Scan(bus); !slices.Equal(got, want) {
		t.Errorf("Scan = %v\nwant %v", got, want)
	}
}
