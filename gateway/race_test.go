//go:build race

package gateway_test

// raceDetector is true when the tests run with -race, which multiplies
// memory use: memory limits are checked without it.
const raceDetector = true
