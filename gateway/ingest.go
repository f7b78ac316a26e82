package gateway

import (
	"errors"
	"strconv"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/gateway/payload"
)

var allReasons = payload.AllReasons

const numReasons = len(payload.AllReasons)

func reasonIndex(r payload.Reason) int {
	for i, x := range allReasons {
		if x == r {
			return i
		}
	}
	return -1
}

// ingestHandler receives the decoder's output for one publication at a time.
// It lives in the Gateway and is used with g.mu held, so decoding a
// publication allocates nothing for it.
type ingestHandler struct {
	g       *Gateway
	topic   string
	client  string
	device  string // if set, the only device the readings may name (journal.FlagDevice)
	payload []byte
	now     time.Time
}

// ReasonDeviceNotAllowed is the dead-letter reason of a reading that names
// a device its publisher may not publish for.
const ReasonDeviceNotAllowed = "device_not_allowed"

func (h *ingestHandler) Reading(r aggregate.Reading) {
	if h.device != "" && r.Device != h.device {
		// Decided here, where the device is known (a payload may name
		// it), from the journaled record alone: replay decides the same.
		h.g.notAllowed.Add(1)
		detail := "the publisher may publish readings of device " + strconv.Quote(h.device) + " only"
		h.g.emitDeadLetter(DeadLetter{
			Reason: ReasonDeviceNotAllowed, Detail: detail, Source: "mqtt", Topic: h.topic, Client: h.client,
			Device: r.Device, ReceivedAt: h.now, HasReading: true, Reading: r,
		})
		h.g.logRejected(ReasonDeviceNotAllowed, h.topic, h.client, detail, h.now)
		return
	}
	o := h.g.agg.Add(r)
	if o.Accepted() {
		return
	}
	h.g.emitDeadLetter(DeadLetter{
		Reason: o.String(), Detail: outcomeDetail(o), Source: "mqtt", Topic: h.topic, Client: h.client,
		Device: r.Device, ReceivedAt: h.now, HasReading: true, Reading: r,
	})
	h.g.logRejected(o.String(), h.topic, h.client, outcomeDetail(o), h.now)
}

func (h *ingestHandler) Reject(e *payload.Error) {
	h.g.reject(e, h.topic, h.client, h.payload, h.now)
}

func outcomeDetail(o aggregate.Outcome) string {
	switch o {
	case aggregate.TooLate:
		return "reading is later than aggregate.allowed_lateness behind its device's watermark"
	case aggregate.Future:
		return "reading is stamped further ahead of the gateway clock than aggregate.max_future_skew"
	case aggregate.Evicted:
		return "the window's state was evicted (aggregate.max_retained_windows), so it cannot be revised"
	case aggregate.Invalid:
		return "reading has no device or metric name, or a non-finite value"
	}
	return ""
}

// ingestLocked decodes one journaled publication into readings and
// aggregates them, with g.mu held. now is its arrival time.
func (g *Gateway) ingestLocked(topic, client string, body []byte, now time.Time) {
	h := &g.ing
	h.topic, h.client, h.payload, h.now = topic, client, body, now
	matched, err := g.dec.Decode(topic, body, now, h)
	h.payload = nil
	if err != nil {
		var e *payload.Error
		if errors.As(err, &e) {
			g.reject(e, topic, client, body, now)
		}
	}
	if matched {
		g.publishes.Add(1)
	}
}

// reject counts a decoder refusal, dead-letters it with the payload, and
// logs it at a rate limit.
func (g *Gateway) reject(e *payload.Error, topic, client string, body []byte, now time.Time) {
	if i := reasonIndex(e.Reason); i >= 0 {
		g.rejected[i].Add(1)
	}
	var device string
	for _, p := range g.dec.Patterns() {
		if d, _, ok := p.Match(topic); ok {
			device = d
			break
		}
	}
	detail := e.Detail
	if e.Item != "" {
		detail = e.Item + ": " + detail
	}
	g.emitDeadLetter(DeadLetter{
		Reason: string(e.Reason), Detail: detail, Source: "mqtt", Topic: topic, Client: client,
		Device: device, ReceivedAt: now, Payload: append([]byte{}, body...),
	})
	g.logRejected(string(e.Reason), topic, client, detail, now)
}

func (g *Gateway) logRejected(reason, topic, client, detail string, now time.Time) {
	if ok, held := g.logLimiter.Allow(reason, now); ok {
		g.log.Warn("reading refused; sent to dead letters", "reason", reason, "topic", topic, "client", client,
			"detail", detail, "suppressed_since_last", held)
	}
}
