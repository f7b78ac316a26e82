// Package output joins the gateway to the forwarder: it is the
// gateway.Output that turns summaries and dead letters into Kafka records
// in the outbound queue, each with its journal mark. The gateway and the
// bridge know nothing of each other; this is where they meet, for the
// edgegate binary and for tests that run the whole path.
package output

import (
	"encoding/hex"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/summary"
	"github.com/edgegate/edgegate/gateway"
)

// Forwarder returns f as the gateway's Output.
func Forwarder(f *bridge.Forwarder) gateway.Output { return forwarder{f} }

type forwarder struct{ f *bridge.Forwarder }

var _ gateway.Output = forwarder{}

func (o forwarder) Summary(s aggregate.Summary, m gateway.Mark) { o.f.Summary(s, bridge.Mark(m)) }

// DeadLetter maps the gateway's dead letter onto the dead-letter record
// (the forwarder fills in the gateway id).
func (o forwarder) DeadLetter(d gateway.DeadLetter, m gateway.Mark) {
	w := summary.DeadLetter{Reason: d.Reason, Detail: d.Detail, Source: d.Source, Topic: d.Topic, Client: d.Client,
		Device: d.Device, ReceivedAt: d.ReceivedAt, Payload: d.Payload, HasReading: d.HasReading}
	if d.HasReading {
		w.Metric, w.Unit, w.Time, w.Value = d.Reading.Metric, d.Reading.Unit, d.Reading.Time, d.Reading.Value
	}
	if d.Payload != nil {
		w.PayloadBytes, w.PayloadSHA256 = d.PayloadBytes, hex.EncodeToString(d.PayloadSHA256[:])
	}
	for _, r := range d.Reasons {
		w.Reasons = append(w.Reasons, summary.ReasonCount{Reason: r.Reason, Count: r.Count, Detail: r.Detail})
	}
	for _, it := range d.Items {
		x := summary.Item{Reason: it.Reason, Item: it.Item, Detail: it.Detail, HasReading: it.HasReading}
		if it.HasReading {
			x.Metric, x.Unit, x.Time, x.Value = it.Reading.Metric, it.Reading.Unit, it.Reading.Time, it.Reading.Value
		}
		w.Items = append(w.Items, x)
	}
	w.ItemsTotal = d.ItemsTotal
	o.f.DeadLetter(w, bridge.Mark(m))
}

func (o forwarder) Full() bool           { return o.f.Full() }
func (o forwarder) Stored() gateway.Mark { return gateway.Mark(o.f.Stored()) }
func (o forwarder) Sync() error          { return o.f.Sync() }
