package gateway

import (
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/gateway/broker"
	"github.com/edgegate/edgegate/gateway/clock"
	"github.com/edgegate/edgegate/gateway/sensors"
	"github.com/edgegate/edgegate/gateway/sparkplug"
	"periph.io/x/conn/v3/i2c"
)

// DefaultDeadLetterPayload is the default of Options.DeadLetterPayload:
// enough to see what a device sent, while the dead letter of a 64 KiB
// publication costs the outbound queue about 5 KiB instead of all of it.
const DefaultDeadLetterPayload = 4 << 10

// Options configures a Gateway. cmd/edgegate derives them from the
// configuration file (configs.Config.GatewayOptions).
type Options struct {
	// DataDir holds the ingest journal (ingest/) and the state file
	// (state/state.db).
	DataDir string
	// Topics are the reading topic patterns ({device}, {metric}); see
	// package payload.
	Topics     []string
	MaxPayload int // bytes of one publication's payload
	// DeadLetterPayload bounds the payload copied into a dead letter, in
	// bytes (its length and hash are always there); 0 means
	// DefaultDeadLetterPayload.
	DeadLetterPayload int
	Aggregate         aggregate.Config
	// FsyncInterval is the least time between two journal fsyncs;
	// CheckpointInterval how often a checkpoint may be written.
	FsyncInterval      time.Duration
	CheckpointInterval time.Duration
	Broker             broker.Options
	// Sensors are the gateway's own I²C sensors, opened with OpenBus
	// (periph's i2creg.Open); SensorTopic gives the topic a sensor's
	// reading is journaled on.
	Sensors     []sensors.Sensor
	OpenBus     func(name string) (i2c.BusCloser, error)
	SensorTopic func(device, metric string) string
	// Sparkplug, if set, makes the gateway a Sparkplug B host: it ingests
	// the BIRTH, DATA and DEATH messages of the groups served (package
	// sparkplug) and publishes its STATE and rebirth requests.
	Sparkplug *sparkplug.Options
	// Clock is the gateway's clock: wall, monotonic, boot and
	// synchronization (clock.System in production). Nil: the now given to
	// New, taken as synchronized.
	Clock clock.Clock
	// HoldMaxBytes and HoldMaxAge bound the hold of readings the gateway
	// stamps while its clock is not synchronized (hold.go): beyond either,
	// they are aggregated unverified. HoldMaxBytes 0 holds none: they are
	// aggregated at once, unverified.
	HoldMaxBytes int64
	HoldMaxAge   time.Duration
}
