//go:build !race

package gateway_test

const raceDetector = false
