package bridge

import (
	"encoding/base64"
	"time"
	"unicode/utf8"

	"github.com/edgegate/edgegate/aggregate"
)

// DeadLetterSchemaVersion is the version of the dead-letter record's JSON
// schema.
const DeadLetterSchemaVersion = 1

// DeadLetter is input that did not become part of a summary, with the
// reason. Either the raw payload (it could not be decoded) or the decoded
// reading (it was refused by the windowing rules) is set.
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

// AppendJSON appends the dead letter as one JSON object:
//
//	{"gateway","reason","detail","source","topic","client","received_at",
//	 "payload" (text, when valid UTF-8) or "payload_base64",
//	 "device","metric","unit","time","value" (when a reading was decoded)}
func (d *DeadLetter) AppendJSON(b []byte) []byte {
	field := func(name, v string) {
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = aggregate.AppendJSONString(b, v)
	}
	b = append(b, `{"gateway":`...)
	b = aggregate.AppendJSONString(b, d.Gateway)
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
	}
	if d.Device != "" {
		field("device", d.Device)
	}
	if d.HasReading {
		field("metric", d.Reading.Metric)
		if d.Reading.Unit != "" {
			field("unit", d.Reading.Unit)
		}
		field("time", d.Reading.Time.UTC().Format(time.RFC3339Nano))
		b = append(b, `,"value":`...)
		b = aggregate.AppendFloat(b, d.Reading.Value)
	}
	return append(b, '}')
}
