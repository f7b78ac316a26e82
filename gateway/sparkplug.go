package gateway

import (
	"strconv"
	"time"

	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// The gateway as a Sparkplug B host (package sparkplug): Sparkplug
// publications are journaled like readings, and the applier hands them to
// the host state instead of the payload decoder. What the host refuses
// goes into the publication's one dead letter; the rebirth requests it
// makes are published on the broker as NCMDs once the broker serves (not
// while the journal is replayed at start).

// sparkplugTopic reports whether topic is a Sparkplug message the gateway
// ingests.
func (g *Gateway) sparkplugTopic(topic string) (sparkplug.Topic, bool) {
	if g.sp == nil {
		return sparkplug.Topic{}, false
	}
	return g.sp.Ingests(topic)
}

// WillTopic reports whether a client's will on topic is journaled as its
// publication when the broker sends it (broker.Ingest): an NDEATH ends
// the edge node's session.
func (g *Gateway) WillTopic(topic string) bool {
	t, ok := g.sparkplugTopic(topic)
	return ok && t.Type == sparkplug.NDeath
}

// ingestSparkplug applies one journaled Sparkplug publication, with g.mu
// held. A publisher of the device role (its identity journaled with the
// publication) may speak for the edge node of its identity only, and the
// host binds it to one group (the first it births in).
func (g *Gateway) ingestSparkplug(t sparkplug.Topic, body []byte, now time.Time, h *ingestHandler) {
	if h.device != "" && t.Node != h.device {
		g.notAllowed.Add(1)
		h.refuse(DeadItem{Reason: ReasonDeviceNotAllowed, Detail: "the publisher may publish for Sparkplug edge node " + strconv.Quote(h.device) + " only"}, h.device)
		h.withPayload()
		return
	}
	// The device names of Sparkplug readings are not the identity: the
	// topic check above is the one that applies.
	own := h.device
	h.device = ""
	g.sp.Apply(t, body, sparkplug.Event{Now: now, Elapsed: time.Duration(g.tl.Elapsed), Identity: own}, h)
	h.device = own
}

// expireSparkplug forgets the edge nodes and devices due at a tick, with
// g.mu held.
func (g *Gateway) expireSparkplug() {
	if g.sp != nil {
		g.sp.Expire(time.Duration(g.tl.Elapsed), &g.ing)
	}
}

// sparkplugDue reports whether a tick at elapsed time el would forget an
// edge node or a device (so that the tick is journaled).
func (g *Gateway) sparkplugDue(el time.Duration) bool {
	return g.sp != nil && g.sp.Due(el)
}

// Forget drops a forgotten edge node's or device's readings' device from
// the aggregator (sparkplug.Handler).
func (h *ingestHandler) Forget(device string) {
	h.g.agg.Forget(device)
}

// Rebirth asks an edge node for a new BIRTH (sparkplug.Handler): an NCMD
// with Node Control/Rebirth, at QoS 0, to its subscription on the broker.
// During the replay at start nothing is published: the broker does not
// serve yet, and the request was made (or not needed) the first time.
func (h *ingestHandler) Rebirth(group, node string) {
	g := h.g
	if !g.serving.Load() {
		return
	}
	if err := g.broker.Publish(sparkplug.CommandTopic(group, node), sparkplug.RebirthCommand(h.now)); err != nil {
		g.log.Warn("sparkplug rebirth request not published", "group", group, "node", node, "err", err)
	}
}

// publishState publishes the host's STATE message (retained, QoS 1):
// online once the broker serves, offline as it stops. The host is the
// broker's own process, so the offline message is its will: published
// at a clean stop; after a crash the edge nodes lose their connections
// with the broker, and find the new online STATE when they reconnect.
func (g *Gateway) publishState(online bool) {
	if g.sp == nil {
		return
	}
	topic := sparkplug.StateTopic(g.sp.Options().HostID)
	if err := g.broker.PublishRetained(topic, sparkplug.StatePayload(online, g.now())); err != nil {
		g.log.Warn("sparkplug STATE not published", "topic", topic, "err", err)
	}
}

// sparkplugDevice returns the device a Sparkplug topic's dead letter is
// filed under.
func (g *Gateway) sparkplugDevice(topic string) (string, bool) {
	t, ok := g.sparkplugTopic(topic)
	if !ok {
		return "", false
	}
	return g.sp.DeviceName(t), true
}

// restoreSparkplug restores the host state from a checkpoint section.
func (g *Gateway) restoreSparkplug(snap []byte) {
	if g.sp == nil {
		if len(snap) > 0 {
			g.log.Warn("the checkpoint holds Sparkplug host state but sparkplug.enabled is false; it is dropped")
		}
		return
	}
	if err := g.sp.Restore(snap, time.Duration(g.tl.Elapsed)); err != nil {
		g.log.Error("sparkplug host state in the checkpoint undecodable; edge nodes are asked to rebirth on their next DATA", "err", err)
	}
}

// sparkplugSnapshot returns the host state for the checkpoint.
func (g *Gateway) sparkplugSnapshot() []byte {
	if g.sp == nil {
		return nil
	}
	return g.sp.AppendSnapshot(nil)
}

var _ sparkplug.Handler = (*ingestHandler)(nil)
