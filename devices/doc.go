// Package devices holds drivers for the I²C environmental sensors a
// gateway reads itself, one package per chip, written on
// periph.io/x/conn/v3 the way periph's own drivers are (a driver takes a
// bus and never opens it; Halt; typed units): bme280 (Bosch BME280 and
// BMP280), sht3x (Sensirion SHT30/31/35) and bh1750 (ROHM BH1750FVI).
// Each driver also identifies its chip (Probe) and names its addresses.
//
// This package itself is the one table of drivers (Drivers, Lookup): per
// driver its configuration name, metrics with units, addresses, Probe and
// Open, which returns a Sensor reading plain Values. The configuration
// validates against it, the gateway's poller opens sensors through it, and
// Scan identifies the chips on a bus with it. It imports periph's conn
// packages and nothing else outside the standard library.
//
// Register-level emulators of the chips are in firmware-sim.
package devices
