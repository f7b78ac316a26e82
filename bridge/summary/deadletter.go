package summary

import (
	"encoding/base64"
	"strconv"
	"time"
	"unicode/utf8"
)

// DeadLetterSchemaVersion is the version of the dead-letter record's JSON,
// written in the HeaderSchema header of dead-letter records.
const DeadLetterSchemaVersion = 1

// DeadLetter is the value of a dead-letter record: input that did not
// become part of a summary, with the reason. Either the raw payload (it
// could not be decoded) or the decoded reading (HasReading: it was refused
// by the windowing rules) is set.
type DeadLetter struct {
	Gateway    string
	Reason     string // stable machine-readable reason, e.g. "too_late", "invalid_json"
	Detail     string // human-readable explanation
	Source     string // where it came from, e.g. "mqtt"
	Topic      string
	Client     string
	Device     string // when known (from the topic or the reading)
	ReceivedAt time.Time
	Payload    []byte // raw payload, for undecodable input; at most its first PayloadLimit bytes
	// PayloadBytes is the whole payload's length and PayloadSHA256 its
	// SHA-256 in hex, when Payload is set: a cut payload can still be
	// matched against the device's own log.
	PayloadBytes  int
	PayloadSHA256 string

	// The decoded reading, when HasReading is set.
	HasReading bool
	Metric     string
	Unit       string
	Time       time.Time
	Value      float64

	// Reasons lists every reason of the publication, in order of first
	// occurrence, with how many items ended in it. Reason and Detail are
	// the first of them.
	Reasons []ReasonCount
	// Items are the first refused items of the publication (at most
	// MaxItems), ItemsTotal how many there were.
	Items      []Item
	ItemsTotal int
}

// PayloadLimit bounds the payload copied into a dead letter, in bytes: the
// dead letter of a 64 KiB publication costs the queue about 5 KiB, not the
// whole payload.
const PayloadLimit = 4 << 10

// MaxItems bounds the items listed in one dead letter; the others are
// counted in Reasons and ItemsTotal.
const MaxItems = 32

// ReasonCount is one reason of a dead letter, with the number of items that
// ended in it and the first one's detail.
type ReasonCount struct {
	Reason string
	Count  int
	Detail string
}

// Item is one refused item of a publication: a field, SenML record or
// reading, with its reason; a decoded reading (HasReading) also has its
// metric, unit, time and value.
type Item struct {
	Reason     string
	Item       string // the metric, JSON key or SenML record, when known
	Detail     string
	HasReading bool
	Metric     string
	Unit       string
	Time       time.Time
	Value      float64
}

// RecordKey returns the Kafka record key of the dead letter:
// "<gateway>/<device>" when the device is known, else "<gateway>".
func (d *DeadLetter) RecordKey() []byte {
	if d.Device == "" {
		return []byte(d.Gateway)
	}
	return []byte(d.Gateway + "/" + d.Device)
}

// AppendJSON appends the dead letter as one JSON object:
//
//	{"gateway","reason","detail","source","topic","client","received_at",
//	 "payload" (text, when valid UTF-8) or "payload_base64",
//	 "payload_bytes","payload_sha256" (with the payload: its whole length and hash;
//	 "payload" holds at most its first PayloadLimit bytes),
//	 "device","metric","unit","time","value" (when a reading was decoded),
//	 "reasons":[{"reason","count","detail"}] (every reason of the publication),
//	 "items":[{"reason","item","detail","metric","unit","time","value"}],"items_total"}
//
// Empty optional fields are left out. The fields after "payload" were
// added in schema 1 without a version change: consumers that read only
// "reason" see the first reason, as before.
func (d *DeadLetter) AppendJSON(b []byte) []byte {
	field := func(name, v string) {
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = appendString(b, v)
	}
	b = append(b, `{"gateway":`...)
	b = appendString(b, d.Gateway)
	field("reason", d.Reason)
	if d.Detail != "" {
		field("detail", d.Detail)
	}
	if d.Source != "" {
		field("source", d.Source)
	}
	if d.Topic != "" {
		field("topic", d.Topic)
	}
	if d.Client != "" {
		field("client", d.Client)
	}
	field("received_at", d.ReceivedAt.UTC().Format(time.RFC3339Nano))
	if d.Payload != nil {
		if utf8.Valid(d.Payload) {
			field("payload", string(d.Payload))
		} else {
			field("payload_base64", base64.StdEncoding.EncodeToString(d.Payload))
		}
		if d.PayloadBytes > 0 {
			b = append(b, `,"payload_bytes":`...)
			b = strconv.AppendInt(b, int64(d.PayloadBytes), 10)
		}
		if d.PayloadSHA256 != "" {
			field("payload_sha256", d.PayloadSHA256)
		}
	}
	if d.Device != "" {
		field("device", d.Device)
	}
	if d.HasReading {
		b = appendReading(b, d.Metric, d.Unit, d.Time, d.Value)
	}
	if len(d.Reasons) > 0 {
		b = append(b, `,"reasons":[`...)
		for i, r := range d.Reasons {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"reason":`...)
			b = appendString(b, r.Reason)
			b = append(b, `,"count":`...)
			b = strconv.AppendInt(b, int64(r.Count), 10)
			if r.Detail != "" {
				b = append(b, `,"detail":`...)
				b = appendString(b, r.Detail)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(d.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i := range d.Items {
			if i > 0 {
				b = append(b, ',')
			}
			b = d.Items[i].appendJSON(b)
		}
		b = append(b, `],"items_total":`...)
		b = strconv.AppendInt(b, int64(d.ItemsTotal), 10)
	}
	return append(b, '}')
}

func (it *Item) appendJSON(b []byte) []byte {
	b = append(b, `{"reason":`...)
	b = appendString(b, it.Reason)
	field := func(name, v string) {
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = appendString(b, v)
	}
	if it.Item != "" {
		field("item", it.Item)
	}
	if it.Detail != "" {
		field("detail", it.Detail)
	}
	if it.HasReading {
		b = appendReading(b, it.Metric, it.Unit, it.Time, it.Value)
	}
	return append(b, '}')
}

// appendReading appends a decoded reading's fields: "metric", "unit" (if
// any), "time" and "value".
func appendReading(b []byte, metric, unit string, t time.Time, v float64) []byte {
	b = append(b, `,"metric":`...)
	b = appendString(b, metric)
	if unit != "" {
		b = append(b, `,"unit":`...)
		b = appendString(b, unit)
	}
	b = append(b, `,"time":`...)
	b = appendString(b, t.UTC().Format(time.RFC3339Nano))
	b = append(b, `,"value":`...)
	return appendFloat(b, v)
}
