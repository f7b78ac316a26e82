package gateway_test

import (
	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/gateway"
)

// forwarderOutput is the gateway's Output on a bridge.Forwarder, as
// cmd/edgegate composes them.
type forwarderOutput struct{ f *bridge.Forwarder }

func (o forwarderOutput) Summary(s aggregate.Summary, m gateway.Mark) { o.f.Summary(s, bridge.Mark(m)) }

func (o forwarderOutput) DeadLetter(d gateway.DeadLetter, m gateway.Mark) {
	o.f.DeadLetter(bridge.DeadLetter{Reason: d.Reason, Detail: d.Detail, Source: d.Source, Topic: d.Topic, Client: d.Client,
		Device: d.Device, ReceivedAt: d.ReceivedAt, Payload: d.Payload, HasReading: d.HasReading, Reading: d.Reading}, bridge.Mark(m))
}

func (o forwarderOutput) Full() bool           { return o.f.Full() }
func (o forwarderOutput) Stored() gateway.Mark { return gateway.Mark(o.f.Stored()) }
func (o forwarderOutput) Sync() error          { return o.f.Sync() }
