package broker

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// bounds is the broker's second mochi hook, added after hook: it bounds
// what mochi holds for clients. It sends at once a delayed will mochi
// would send without OnWillSent, so never journaled (OnWill).
type bounds struct {
	mqtt.HookBase
	b *Broker
}

func newBounds(b *Broker) *bounds {
	return &bounds{b: b}
}

func (h *bounds) ID() string { return "edgegate-bounds" }

func (h *bounds) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnWill}, []byte{b})
}

// OnWill runs as a client's connection ends without DISCONNECT, before
// mochi sends the client's will (or holds it for its delay).
//
// A will delay is dropped when the session ends with the connection (no
// session expiry): the will is then due at once [MQTT-3.1.3-9], and mochi
// would hold it and, the client being gone by then, publish it without
// OnWillSent. It is dropped too for a will the gateway ingests (a
// Sparkplug NDEATH): its sending is journaled only by OnWillSent, which
// mochi calls for a delayed will only if the session still exists when
// the delay passes, and a will held in mochi's memory is lost at a
// restart, leaving the node online for good. Such a will is sent when the
// connection breaks, as if no delay had been asked for.
func (h *bounds) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if will.WillDelayInterval > 0 && (!persistent(cl) || h.b.in.WillTopic(will.TopicName)) {
		will.WillDelayInterval = 0
		// mochi reads the delay from the client, not from the will this
		// returns; only this client's goroutine, which sends the will,
		// reads it now.
		cl.Properties.Will.WillDelayInterval = 0
	}
	return will, nil
}
