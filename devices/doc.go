// Package devices will hold drivers for the I2C environmental sensors a
// gateway reads itself (Bosch BME280, Sensirion SHT3x, ROHM BH1750), written
// on periph.io/x/conn/v3. It has no drivers yet.
package devices
