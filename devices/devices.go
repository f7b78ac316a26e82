package devices

import (
	"errors"
	"fmt"
	"slices"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"

	"github.com/edgegate/edgegate/devices/bh1750"
	"github.com/edgegate/edgegate/devices/bme280"
	"github.com/edgegate/edgegate/devices/sht3x"
)

// Metric is a quantity a driver reports.
type Metric struct {
	Name string // e.g. "temperature": the metric of the readings, unless renamed
	Unit string // UCUM-style, as readings carry it: "Cel", "Pa", "%RH", "lx"
}

// Value is one metric of a Sensor's reading.
type Value struct {
	Metric string  // a Metric.Name of the sensor's driver
	Unit   string  // that metric's Metric.Unit
	V      float64 // in Unit
}

// Sensor is an opened chip. Its methods make bus transactions and must not
// be called concurrently; the bus stays the caller's to close.
type Sensor interface {
	// Read measures once and returns each metric the chip has (a
	// BMP280 has no humidity), in the order of its Driver's Metrics.
	Read() ([]Value, error)
	// Halt puts the chip in its lowest-power state; a later Read wakes
	// it.
	Halt() error
}

// Driver is one entry of the table of drivers: everything the gateway,
// its configuration and its scan command need to know about a chip family.
type Driver struct {
	// Name is the driver's name in the configuration (sensors[].driver).
	Name string
	// Chips are the chips it drives, as their datasheets name them; the
	// first is the one it is named after.
	Chips []string
	// Metrics are what it can report, in the order Read returns them.
	Metrics []Metric
	// Addresses are the chip's possible 7-bit I²C addresses, the
	// default (address pin low) first.
	Addresses []uint16
	// Probe identifies the chip at addr by its own means (an id register,
	// a checksum, or only an acknowledgement). ok reports that the chip is
	// one of Chips; what describes what answered, for a person (e.g.
	// "BME280 (chip id 0x60)"), and is empty when nothing answered the
	// identification. It makes a few bus transactions and leaves the chip
	// idle.
	Probe func(bus i2c.Bus, addr uint16) (what string, ok bool)
	// Open checks and configures the chip at addr, ready to Read. It does
	// not open or close the bus.
	Open func(bus i2c.Bus, addr uint16) (Sensor, error)
}

// MetricNames returns the names of d's Metrics, in order.
func (d Driver) MetricNames() []string {
	out := make([]string, len(d.Metrics))
	for i, m := range d.Metrics {
		out[i] = m.Name
	}
	return out
}

var (
	temperature = Metric{"temperature", "Cel"}
	pressure    = Metric{"pressure", "Pa"}
	humidity    = Metric{"humidity", "%RH"}
	illuminance = Metric{"illuminance", "lx"}
)

// drivers is the table. Adding a chip here makes it configurable, polled
// and found by the scan.
var drivers = []Driver{
	{
		Name:      "bme280",
		Chips:     []string{"BME280", "BMP280"},
		Metrics:   []Metric{temperature, pressure, humidity},
		Addresses: []uint16{bme280.Addr, bme280.AltAddr},
		Probe: func(bus i2c.Bus, addr uint16) (string, bool) {
			id, err := bme280.Probe(bus, addr)
			switch {
			case err == nil && id == bme280.ChipIDBMP280:
				return fmt.Sprintf("BMP280 (chip id %#02x)", id), true
			case err == nil:
				return fmt.Sprintf("BME280 (chip id %#02x)", id), true
			case errors.Is(err, bme280.ErrWrongChip):
				return fmt.Sprintf("unknown device (register 0xD0 = %#02x)", id), false
			}
			return "", false
		},
		Open: func(bus i2c.Bus, addr uint16) (Sensor, error) {
			d, err := bme280.NewI2C(bus, addr, &bme280.Opts{Temperature: bme280.O2x, Pressure: bme280.O4x, Humidity: bme280.O1x})
			if err != nil {
				return nil, err
			}
			return bmeSensor{d}, nil
		},
	},
	{
		Name:      "sht3x",
		Chips:     []string{"SHT3x"},
		Metrics:   []Metric{temperature, humidity},
		Addresses: []uint16{sht3x.Addr, sht3x.AltAddr},
		Probe: func(bus i2c.Bus, addr uint16) (string, bool) {
			st, err := sht3x.Probe(bus, addr)
			if err != nil {
				return "", false
			}
			return fmt.Sprintf("SHT3x (status %#04x, CRC ok)", st), true
		},
		Open: func(bus i2c.Bus, addr uint16) (Sensor, error) {
			d, err := sht3x.NewI2C(bus, addr, nil)
			if err != nil {
				return nil, err
			}
			return shtSensor{d}, nil
		},
	},
	{
		Name:      "bh1750",
		Chips:     []string{"BH1750"},
		Metrics:   []Metric{illuminance},
		Addresses: []uint16{bh1750.Addr, bh1750.AltAddr},
		Probe: func(bus i2c.Bus, addr uint16) (string, bool) {
			if bh1750.Probe(bus, addr) != nil {
				return "", false
			}
			return "BH1750 (no id register: by address and power-on)", true
		},
		Open: func(bus i2c.Bus, addr uint16) (Sensor, error) {
			d, err := bh1750.NewI2C(bus, addr, nil)
			if err != nil {
				return nil, err
			}
			return bhSensor{d}, nil
		},
	},
}

// Drivers returns the table of drivers, in a fixed order. The entries'
// slices are shared: do not modify them.
func Drivers() []Driver { return slices.Clone(drivers) }

// Lookup returns the driver named name.
func Lookup(name string) (Driver, bool) {
	i := slices.IndexFunc(drivers, func(d Driver) bool { return d.Name == name })
	if i < 0 {
		return Driver{}, false
	}
	return drivers[i], true
}

func celsius(t physic.Temperature) float64 {
	return float64(t-physic.ZeroCelsius) / float64(physic.Celsius)
}

func percentRH(h physic.RelativeHumidity) float64 {
	return float64(h) / float64(physic.PercentRH)
}

type bmeSensor struct{ d *bme280.Dev }

func (s bmeSensor) Read() ([]Value, error) {
	var e physic.Env
	if err := s.d.Sense(&e); err != nil {
		return nil, err
	}
	v := []Value{
		{temperature.Name, temperature.Unit, celsius(e.Temperature)},
		{pressure.Name, pressure.Unit, float64(e.Pressure) / float64(physic.Pascal)},
	}
	if s.d.Humidity() {
		v = append(v, Value{humidity.Name, humidity.Unit, percentRH(e.Humidity)})
	}
	return v, nil
}

func (s bmeSensor) Halt() error { return s.d.Halt() }

type shtSensor struct{ d *sht3x.Dev }

func (s shtSensor) Read() ([]Value, error) {
	var e physic.Env
	if err := s.d.Sense(&e); err != nil {
		return nil, err
	}
	return []Value{{temperature.Name, temperature.Unit, celsius(e.Temperature)}, {humidity.Name, humidity.Unit, percentRH(e.Humidity)}}, nil
}

func (s shtSensor) Halt() error { return s.d.Halt() }

type bhSensor struct{ d *bh1750.Dev }

func (s bhSensor) Read() ([]Value, error) {
	lux, err := s.d.Sense()
	if err != nil {
		return nil, err
	}
	return []Value{{illuminance.Name, illuminance.Unit, float64(lux) / float64(bh1750.Lux)}}, nil
}

func (s bhSensor) Halt() error { return s.d.Halt() }
