//go:build race

package bridge_test

// raceDetector is true when the tests run with -race.
const raceDetector = true
