package main

import (
	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/gateway"
)

// output is the gateway's Output on the forwarder: summaries and dead
// letters become Kafka records in the outbound queue, each with its
// journal mark. The gateway and the bridge know nothing of each other;
// this is where they meet.
type output struct{ f *bridge.Forwarder }

func (o output) Summary(s aggregate.Summary, m gateway.Mark) { o.f.Summary(s, bridge.Mark(m)) }

func (o output) DeadLetter(d gateway.DeadLetter, m gateway.Mark) {
	o.f.DeadLetter(bridge.DeadLetter{Reason: d.Reason, Detail: d.Detail, Source: d.Source, Topic: d.Topic, Client: d.Client,
		Device: d.Device, ReceivedAt: d.ReceivedAt, Payload: d.Payload, HasReading: d.HasReading, Reading: d.Reading}, bridge.Mark(m))
}

func (o output) Full() bool           { return o.f.Full() }
func (o output) Stored() gateway.Mark { return gateway.Mark(o.f.Stored()) }
func (o output) Sync() error          { return o.f.Sync() }
