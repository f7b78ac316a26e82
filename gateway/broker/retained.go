package broker

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// RetainedLimits bound the retained messages the broker keeps: mochi
// keeps every one (for up to a day, its message expiry) with no bound of
// its own. A message counts its topic, payload and messageOverhead bytes.
type RetainedLimits struct {
	Count            int   // in all (mqtt.max_retained)
	Bytes            int64 // in all (mqtt.max_retained_bytes)
	PerIdentity      int   // of one identity (mqtt.max_retained_per_identity)
	BytesPerIdentity int64 // of one identity (mqtt.max_retained_bytes_per_identity)
}

// retained accounts for the retained messages mochi keeps, by topic and by
// the identity that published each, from what mochi reports it retained
// (OnRetainMessage) and expired (OnRetainedExpired). The gateway's own
// (the Sparkplug host's STATE) count in all but are never refused;
// mochi's $SYS topics are not counted.
//
// A publication is admitted (OnPublish) against the account before mochi
// retains it: publications on one topic racing each other may be
// accounted in another order than mochi retains them, and concurrent ones
// may each be admitted against an account that does not hold the others
// yet. Both are bounded by the number of clients publishing at once.
type retained struct {
	limits RetainedLimits

	mu     sync.Mutex
	topics map[string]retainedMessage // by topic
	shares map[string]*retainedShare  // by identity
	bytes  int64                      // of all the topics
}

type retainedMessage struct {
	owner string
	cost  int64
}

type retainedShare struct {
	n     int
	bytes int64
}

// admit reports whether owner may retain a message of cost on topic,
// replacing the one there; if not, it names the bound that would be
// passed.
func (r *retained) admit(owner, topic string, cost int64) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.topics[topic]
	n, bytes := len(r.topics)+1, r.bytes+cost
	var sh retainedShare
	if s := r.shares[owner]; s != nil {
		sh = *s
	}
	sh.n++
	sh.bytes += cost
	if had {
		n--
		bytes -= old.cost
		if old.owner == owner {
			sh.n--
			sh.bytes -= old.cost
		}
	}
	switch {
	case sh.n > r.limits.PerIdentity:
		return "mqtt.max_retained_per_identity", false
	case sh.bytes > r.limits.BytesPerIdentity:
		return "mqtt.max_retained_bytes_per_identity", false
	case n > r.limits.Count:
		return "mqtt.max_retained", false
	case bytes > r.limits.Bytes:
		return "mqtt.max_retained_bytes", false
	}
	return "", true
}

// set records that mochi retained a message of cost by owner on topic,
// or (cost 0) that it deleted the one there.
func (r *retained) set(owner, topic string, cost int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.topics == nil {
		r.topics = map[string]retainedMessage{}
		r.shares = map[string]*retainedShare{}
	}
	if old, ok := r.topics[topic]; ok {
		delete(r.topics, topic)
		r.bytes -= old.cost
		sh := r.shares[old.owner]
		if sh.n--; sh.n == 0 {
			delete(r.shares, old.owner)
		} else {
			sh.bytes -= old.cost
		}
	}
	if cost == 0 {
		return
	}
	r.topics[topic] = retainedMessage{owner: owner, cost: cost}
	r.bytes += cost
	sh := r.shares[owner]
	if sh == nil {
		sh = &retainedShare{}
		r.shares[owner] = sh
	}
	sh.n++
	sh.bytes += cost
}

// held returns the count and bytes of the retained messages kept.
func (r *retained) held() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.topics), r.bytes
}

// OnPublish does not honour the retain flag of a publication beyond the
// retained bounds: the publication is acknowledged and routed as usual
// (hook journaled it, a reading, before), but not retained, and the
// message retained on its topic before, if any, stays. A deletion (empty
// payload) is always honoured and frees its share.
func (h *bounds) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if !pk.FixedHeader.Retain || len(pk.Payload) == 0 || cl.Net.Inline {
		return pk, nil
	}
	if why, ok := h.retained.admit(h.identity(cl), pk.TopicName, messageCost(pk)); !ok {
		pk.FixedHeader.Retain = false
		if h.b.hook.subs.none() {
			pk.Ignore = true // nowhere to route it: spare mochi its subscriber lookup (as hook does)
		}
		h.refuseRetained(cl, pk.TopicName, why)
	}
	return pk, nil
}

// refuseRetained counts and logs a retain flag not honoured.
func (h *bounds) refuseRetained(cl *mqtt.Client, topic, bound string) {
	b := h.b
	b.mqttRefused[RefusedRetainedLimit].Add(1)
	if ok, held := b.logLimiter.Allow("retained", b.now()); ok {
		b.log.Warn("mqtt retained message not retained: "+bound+" reached (the publication is taken, not retained)",
			"client", cl.ID, "identity", h.identity(cl), "topic", topic, "suppressed_since_last", held)
	}
}

// OnRetainMessage accounts for a message mochi retained or deleted.
func (h *bounds) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	if len(pk.Payload) == 0 {
		h.retained.set("", pk.TopicName, 0)
		return
	}
	h.retained.set(h.identity(cl), pk.TopicName, messageCost(pk))
}

// OnRetainedExpired accounts for a retained message mochi let expire.
func (h *bounds) OnRetainedExpired(topic string) {
	h.retained.set("", topic, 0)
}
