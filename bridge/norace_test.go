//go:build !race

package bridge_test

const raceDetector = false
