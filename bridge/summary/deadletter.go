package summary

import (
	"encoding/base64"
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
	Payload    []byte // raw payload, for undecodable input

	// The decoded reading, when HasReading is set.
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
//	 "device","metric","unit","time","value" (when a reading was decoded)}
//
// Empty optional fields are left out.
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
	}
	if d.Device != "" {
		field("device", d.Device)
	}
	if d.HasReading {
		field("metric", d.Metric)
		if d.Unit != "" {
			field("unit", d.Unit)
		}
		field("time", d.Time.UTC().Format(time.RFC3339Nano))
		b = append(b, `,"value":`...)
		b = appendFloat(b, d.Value)
	}
	return append(b, '}')
}
