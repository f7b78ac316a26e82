package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"periph.io/x/conn/v3/driver/driverreg"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	// Of periph's host drivers only the Linux ones: sysfs, whose I2C
	// driver registers the buses (/dev/i2c-N, also named I2CN and N), and
	// gpioioctl, which sysfs's GPIO driver requires. periph's host package
	// would register every board's drivers too (Allwinner, BCM283x,
	// BeagleBone, ...), which the gateway does not use: its sensors talk
	// to /dev/i2c-N at the bus's own speed.
	_ "periph.io/x/host/v3/gpioioctl"
	_ "periph.io/x/host/v3/sysfs"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/devices"
	"github.com/edgegate/edgegate/firmware-sim/chips"
)

// emulatedBusName is the bus name a config uses for simulated chips.
const emulatedBusName = "emulated"

var registerOnce sync.Once

// prepareSensors makes the configured buses openable by name: periph's
// sysfs driver for real buses (/dev/i2c-N), and, when a sensor names the
// emulated bus, an emulated bus holding each such sensor's chip, its
// values drifting slowly. A host without I²C is not an error here: those
// sensors fail to open, are reported and retried.
func prepareSensors(cfg *configs.Config, log *slog.Logger) {
	real := false
	var emulated []chips.EmulatedChip
	for _, s := range cfg.Sensors {
		if s.Bus == emulatedBusName {
			emulated = append(emulated, chips.EmulatedChip{Driver: s.Driver, Address: uint16(s.Address)})
		} else {
			real = true
		}
	}
	if real {
		if _, err := driverreg.Init(); err != nil {
			log.Warn("periph drivers did not load; I2C sensors on real buses will not open", "err", err)
		}
	}
	if len(emulated) > 0 {
		registerEmulated(emulated, log)
	}
}

// registerEmulated registers the emulated bus, holding those chips, in periph's
// bus registry; only the first call in a process does.
func registerEmulated(emulated []chips.EmulatedChip, log *slog.Logger) {
	registerOnce.Do(func() {
		bus, err := chips.EmulatedBus(emulatedBusName, emulated...)
		if err != nil {
			log.Warn("emulated I2C bus not built", "err", err)
			return
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
		// One chip of each driver, at its default address.
		var emulated []chips.EmulatedChip
		for _, d := range devices.Drivers() {
			emulated = append(emulated, chips.EmulatedChip{Driver: d.Name, Address: d.Addresses[0]})
		}
		registerEmulated(emulated, slog.New(slog.DiscardHandler))
	} else if _, err := driverreg.Init(); err != nil {
		return fmt.Errorf("load periph drivers: %w", err)
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
	found := devices.Scan(bus)
	fmt.Fprintf(stdout, "bus %s: %d device(s)\n", bus, len(found))
	for _, f := range found {
		fmt.Fprintf(stdout, "  %#02x  %s\n", f.Addr, f.What)
	}
	return nil
}
