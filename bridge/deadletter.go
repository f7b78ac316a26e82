package bridge

import (
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/summary"
)

// DeadLetter is input that did not become part of a summary, with the
// reason. Either the raw payload (it could not be decoded) or the decoded
// reading (it was refused by the windowing rules) is set. Forwarder.
// DeadLetter encodes it as a summary.DeadLetter.
type DeadLetter struct {
	Gateway    string
	Reason     string // stable machine-readable reason, e.g. "too_late", "invalid_json"
	Detail     string // human-readable explanation
	Source     string // where it came from, e.g. "mqtt"
	Topic      string
	Client     string
	Device     string // when known (from the topic or the reading)
	ReceivedAt time.Time
	Payload    []byte // raw payload, for undecodable input

	HasReading bool
	Reading    aggregate.Reading
}

// wire returns the dead letter as package summary encodes it.
func (d *DeadLetter) wire() summary.DeadLetter {
	w := summary.DeadLetter{
		Gateway: d.Gateway, Reason: d.Reason, Detail: d.Detail, Source: d.Source, Topic: d.Topic,
		Client: d.Client, Device: d.Device, ReceivedAt: d.ReceivedAt, Payload: d.Payload,
		HasReading: d.HasReading,
	}
	if d.HasReading {
		w.Metric, w.Unit, w.Time, w.Value = d.Reading.Metric, d.Reading.Unit, d.Reading.Time, d.Reading.Value
	}
	return w
}
