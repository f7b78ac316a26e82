package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	periphhost "periph.io/x/host/v3"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/devices/sht3x"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// emulatedBusName is the bus name a config uses for simulated chips.
const emulatedBusName = "emulated"

var registerOnce sync.Once

// prepareSensors makes the configured buses openable by name: periph's
// host drivers for real buses (/dev/i2c-N), and, when a sensor names the
// emulated bus, an emulated bus holding each such sensor's chip, its
// values drifting slowly. A host without I²C is not an error here: those
// sensors fail to open, are reported and retried.
func prepareSensors(cfg *configs.Config, log *slog.Logger) {
	real, emulated := false, false
	for _, s := range cfg.Sensors {
		if s.Bus == emulatedBusName {
			emulated = true
		} else {
			real = true
		}
	}
	if real {
		if _, err := periphhost.Init(); err != nil {
			log.Warn("periph host drivers did not load; I2C sensors on real buses will not open", "err", err)
		}
	}
	if !emulated {
		return
	}
	registerOnce.Do(func() {
		bus := firmwaresim.NewBus(emulatedBusName)
		for _, s := range cfg.Sensors {
			if s.Bus != emulatedBusName {
				continue
			}
			switch s.Driver {
			case "bme280":
				c := firmwaresim.NewBME280()
				c.Script(func(n int) (float64, float64, float64) {
					x := float64(n) / 30
					return 21 + 1.5*math.Sin(x), 101325 + 150*math.Cos(x/3), 45 + 5*math.Sin(x/2)
				})
				bus.Attach(uint16(s.Address), c)
			case "sht3x":
				c := firmwaresim.NewSHT3x()
				c.Set(20.5, 48)
				bus.Attach(uint16(s.Address), c)
			case "bh1750":
				c := firmwaresim.NewBH1750()
				c.Set(320)
				bus.Attach(uint16(s.Address), c)
			}
		}
		if err := i2creg.Register(emulatedBusName, nil, -1, func() (i2c.BusCloser, error) { return bus, nil }); err != nil {
			log.Warn("emulated I2C bus not registered", "err", err)
		}
	})
}

// cmdSensors is "edgegate sensors scan --bus NAME".
func cmdSensors(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "scan" {
		return usageError{errors.New("sensors: want a subcommand: scan --bus NAME")}
	}
	fs := flagSet("sensors scan", stderr)
	name := fs.String("bus", "", `I2C bus: /dev/i2c-1, I2C1, 1, or "emulated" (a BME280, SHT3x and BH1750 in software)`)
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *name == "" {
		return usageError{errors.New("sensors scan: --bus NAME is required")}
	}
	if *name == emulatedBusName {
		prepareSensors(&configs.Config{Sensors: []configs.Sensor{
			{Bus: emulatedBusName, Address: 0x76, Driver: "bme280"},
			{Bus: emulatedBusName, Address: 0x44, Driver: "sht3x"},
			{Bus: emulatedBusName, Address: 0x23, Driver: "bh1750"},
		}}, slog.New(slog.DiscardHandler))
	} else if _, err := periphhost.Init(); err != nil {
		return fmt.Errorf("load periph host drivers: %w", err)
	}
	bus, err := i2creg.Open(*name)
	if err != nil {
		var names []string
		for _, r := range i2creg.All() {
			names = append(names, r.Name)
		}
		have := "this machine has no I2C bus"
		if len(names) > 0 {
			have = "buses here: " + strings.Join(names, ", ")
		}
		return fmt.Errorf("open i2c bus %q: not found; %s (on a Raspberry Pi: dtparam=i2c_arm=on in /boot/firmware/config.txt, reboot, and membership of group i2c for /dev/i2c-1)", *name, have)
	}
	defer bus.Close()
	found := scanBus(bus)
	fmt.Fprintf(stdout, "bus %s: %d device(s)\n", bus, len(found))
	for _, f := range found {
		fmt.Fprintf(stdout, "  %#02x  %s\n", f.addr, f.what)
	}
	return nil
}

type scanned struct {
	addr uint16
	what string
}

// scanBus lists the addresses that answer a one-byte read (as i2cdetect
// -r does) and identifies the chips edgegate drives: BME280/BMP280 by
// their id register, SHT3x by a status word with a valid CRC, BH1750 (which
// has no id register) by its address and acknowledging power-on.
func scanBus(bus i2c.Bus) []scanned {
	var out []scanned
	for addr := uint16(0x03); addr <= 0x77; addr++ {
		what := identify(bus, addr)
		if what == "" {
			if bus.Tx(addr, nil, make([]byte, 1)) != nil {
				continue
			}
			what = "unknown device"
		}
		out = append(out, scanned{addr, what})
	}
	return out
}

func identify(bus i2c.Bus, addr uint16) string {
	switch addr {
	case 0x76, 0x77:
		var id [1]byte
		if bus.Tx(addr, []byte{0xD0}, id[:]) == nil {
			switch id[0] {
			case 0x60:
				return "BME280 (chip id 0x60)"
			case 0x58:
				return "BMP280 (chip id 0x58)"
			}
			return fmt.Sprintf("unknown device (register 0xD0 = %#02x)", id[0])
		}
	case 0x44, 0x45:
		var st [3]byte
		if bus.Tx(addr, []byte{0xF3, 0x2D}, nil) == nil && bus.Tx(addr, nil, st[:]) == nil && sht3x.CRC8(st[:2]) == st[2] {
			return fmt.Sprintf("SHT3x (status %#04x, CRC ok)", uint16(st[0])<<8|uint16(st[1]))
		}
	case 0x23, 0x5C:
		if bus.Tx(addr, []byte{0x01}, nil) == nil && bus.Tx(addr, []byte{0x00}, nil) == nil {
			return "BH1750 (no id register: by address and power-on)"
		}
	}
	return ""
}
