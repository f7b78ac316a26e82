// Package chips emulates, at register level, the I²C sensors the gateway
// reads itself: BME280/BMP280, SHT3x and BH1750, each modelled from its
// datasheet (not from our drivers), on an emulated bus that implements
// periph's i2c.Bus, with injectable faults (NACK, busy, stuck). The
// drivers' tests, the poller's tests and `edgegate demo` run on them;
// EmulatedBus builds the demo's bus with scripted values.
package chips
