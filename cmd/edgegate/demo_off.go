//go:build nodemo

package main

import (
	"context"
	"errors"
	"io"
)

// Release builds for ARM gateways (make cross, make deb: -tags nodemo) leave
// the demo out: it links kfake (a Kafka-protocol broker), a second Kafka
// client stack and the simulator's two MQTT clients, about 3 MiB of the
// armv7 binary, for a command a gateway never runs.

const demoHelp = "not in this build (ARM release builds leave it out; run it on a developer machine)"

func cmdDemo(context.Context, []string, io.Writer, io.Writer) error {
	return usageError{errors.New("demo: not in this build. ARM release builds (make cross, the armhf and arm64 packages) leave out " +
		"the demo, its in-process Kafka and its simulated devices, to stay small. Run the demo on a developer machine with Go: " +
		"make demo, or go run ./cmd/edgegate demo")}
}
