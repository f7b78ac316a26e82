package broker

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// bounds is the broker's second mochi hook, added after hook: it bounds
// what mochi holds for clients, which mochi itself bounds by count at
// most, never by bytes:
//
//   - retained messages, per identity and in all (retained.go);
//   - QoS 1/2 messages held for subscribers, in flight or queued for an
//     away persistent session, per session and in all (queued.go);
//   - and it sends at once a delayed will mochi would send without
//     OnWillSent, so never journaled (OnWill).
//
// mochi calls its OnPublish after hook's, with hook's packet, and only
// when hook did not end the chain (CodeSuccessIgnore, a refusal): it sees
// every publication mochi may retain, since hook ends the chain only for
// those that are not retained.
type bounds struct {
	mqtt.HookBase
	b        *Broker
	retained retained
	queued   queued
}

func newBounds(b *Broker) *bounds {
	return &bounds{b: b, retained: retained{limits: b.opts.Retained},
		queued: queued{perSession: b.opts.MaxQueuedBytesPerSession, total: b.opts.MaxQueuedBytes}}
}

func (h *bounds) ID() string { return "edgegate-bounds" }

func (h *bounds) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnPublish, mqtt.OnRetainMessage, mqtt.OnRetainedExpired, mqtt.OnWill,
		mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.OnPublishDropped,
		mqtt.OnSessionEstablish, mqtt.OnDisconnect, mqtt.OnClientExpired}, []byte{b})
}

// messageOverhead is what mochi holds for a message beside its topic and
// payload: a packets.Packet is 800 bytes on 64-bit platforms, and the map
// entry that indexes it.
const messageOverhead = 1024

// messageCost is what a message held by mochi is counted for.
func messageCost(pk packets.Packet) int64 {
	return int64(len(pk.TopicName)+len(pk.Payload)) + messageOverhead
}

// identity is the identity a client's retained messages count against:
// that of a connected client (hook's), else (a will sent after its
// connection ended) its username, else its client id; empty for the
// gateway's own publications.
func (h *bounds) identity(cl *mqtt.Client) string {
	if cl.Net.Inline {
		return ""
	}
	if v, ok := h.b.hook.clients.Load(cl); ok {
		return v.(*clientInfo).identity
	}
	if u := string(cl.Properties.Username); u != "" {
		return u
	}
	return cl.ID
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
//
// A retained will beyond the retained bounds is sent not retained, as a
// publication would be.
func (h *bounds) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if will.WillDelayInterval > 0 && (!persistent(cl) || h.b.in.WillTopic(will.TopicName)) {
		will.WillDelayInterval = 0
		// mochi reads the delay from the client, not from the will this
		// returns; only this client's goroutine, which sends the will,
		// reads it now.
		cl.Properties.Will.WillDelayInterval = 0
	}
	if will.Retain && len(will.Payload) > 0 && !cl.Net.Inline {
		if why, ok := h.retained.admit(h.identity(cl), will.TopicName, int64(len(will.TopicName)+len(will.Payload))+messageOverhead); !ok {
			will.Retain = false
			h.refuseRetained(cl, will.TopicName, why)
		}
	}
	return will, nil
}
