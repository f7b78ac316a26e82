package gateway

import (
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

// Output receives what the gateway produces. Calls are made with the
// aggregator's lock held and must not block: hand off or buffer.
type Output interface {
	// Summary and DeadLetter take an output with its mark: the journal
	// event that produced it and its index among that event's outputs.
	Summary(aggregate.Summary, Mark)
	DeadLetter(DeadLetter, Mark)
	// Full reports that the output is over its quota: QoS 1/2 readings are
	// then refused so that devices keep them.
	Full() bool
	// Stored returns the mark of the last output already stored. When the
	// journal is replayed after a crash, outputs up to it are not made
	// again.
	Stored() Mark
	// Sync makes every output so far durable (before a checkpoint).
	Sync() error
}

// Mark names an output by what produced it: the sequence number of the
// ingest event (in the journal) and the output's index among that event's
// outputs, from 1. Marks increase in the order outputs are made, so the
// mark of the last stored output tells a replay of the journal which
// outputs are already stored. The zero Mark is "none".
type Mark struct {
	Seq uint64
	N   uint32
}

// After reports whether m comes after o.
func (m Mark) After(o Mark) bool {
	return m.Seq > o.Seq || m.Seq == o.Seq && m.N > o.N
}

// DeadLetter is input that did not become part of a summary, with the
// reason. Either the raw payload (it could not be decoded) or the decoded
// reading (it was refused by the windowing rules) is set.
type DeadLetter struct {
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

// RecentDeadLetter is one of the latest dead letters, for the status page.
type RecentDeadLetter struct {
	At                            time.Time
	Reason, Device, Topic, Detail string
}
