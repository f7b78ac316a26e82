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

// DeadLetter is what of one publication did not become part of a
// summary, with every reason: at most one per publication. Reason and
// Detail are the first reason; Reasons counts them all, Items lists the
// first refused items. The raw payload (when something could not be
// decoded) is cut to Options.DeadLetterPayload bytes, with its whole
// length and hash; the first refused reading is set when one was.
type DeadLetter struct {
	Reason     string // stable machine-readable reason, e.g. "too_late", "invalid_json"
	Detail     string // human-readable explanation
	Source     string // where it came from, e.g. "mqtt"
	Topic      string
	Client     string
	Device     string // when known (from the topic or the reading)
	ReceivedAt time.Time
	Payload    []byte // raw payload (its first bytes), for undecodable input
	// PayloadBytes and PayloadSHA256 are the whole payload's length and
	// SHA-256, when Payload is set.
	PayloadBytes  int
	PayloadSHA256 [32]byte

	HasReading bool
	Reading    aggregate.Reading

	Reasons    []DeadReason // every reason, in order of first occurrence
	Items      []DeadItem   // the first MaxDeadItems refused items
	ItemsTotal int          // refused items in all
}

// MaxDeadItems bounds the items a dead letter lists; the rest are counted
// in Reasons and ItemsTotal.
const MaxDeadItems = 32

// DeadReason is one reason of a dead letter: how many items of the
// publication ended in it, and the first one's detail.
type DeadReason struct {
	Reason string
	Count  int
	Detail string
}

// DeadItem is one refused item of a publication: a field or record the
// decoder refused (Item names it), or a decoded reading (HasReading) the
// aggregator refused.
type DeadItem struct {
	Reason, Item, Detail string
	HasReading           bool
	Reading              aggregate.Reading
}

// RecentDeadLetter is one of the latest dead letters, for the status page.
type RecentDeadLetter struct {
	At                            time.Time
	Reason, Device, Topic, Detail string
}
