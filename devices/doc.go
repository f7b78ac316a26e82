// Package devices holds drivers for the I²C environmental sensors a
// gateway reads itself, one package per chip, written on
// periph.io/x/conn/v3 the way periph's own drivers are (a driver takes a
// bus and never opens it; Halt; typed units): bme280 (Bosch BME280 and
// BMP280), sht3x (Sensirion SHT30/31/35) and bh1750 (ROHM BH1750FVI).
// Their register-level emulators are in firmware-sim.
package devices
