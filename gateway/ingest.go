package gateway

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

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
// publication allocates nothing for it. What the publication has refused is
// gathered in dl and sent as one dead letter when its decoding ends.
type ingestHandler struct {
	g       *Gateway
	topic   string
	client  string
	device  string // if set, the only device the readings may name (journal.FlagDevice)
	local   bool   // the gateway's own publication (journal.FlagLocal): its times are the gateway's clock
	payload []byte
	now     time.Time
	dl      DeadLetter    // the publication's dead letter so far; Reason is empty while nothing was refused
	payOnce bool          // the payload is in dl
	held    []heldReading // readings held until the clock is synchronized (hold.go)
	share   holdShare     // what the hold holds per device (hold.go)
	// counted is the reason Counted last counted in this publication's
	// dead letter: its index in g.rejected and in dl.Reasons (-1: none).
	counted struct {
		reason         payload.Reason
		rejected, dead int
	}
}

// ReasonDeviceNotAllowed is the dead-letter reason of a reading that names
// a device its publisher may not publish for.
const ReasonDeviceNotAllowed = "device_not_allowed"

var _ payload.Counter = (*ingestHandler)(nil)

func (h *ingestHandler) Reading(r aggregate.Reading) {
	if h.device != "" && r.Device != h.device {
		// Decided here, where the device is known (a payload may name
		// it), from the journaled record alone: replay decides the same.
		// Like every refusal, it goes into the publication's one dead
		// letter.
		h.g.notAllowed.Add(1)
		if h.Counted(ReasonDeviceNotAllowed) {
			return
		}
		detail := "the publisher may publish readings of device " + strconv.Quote(h.device) + " only"
		// Filed under the publisher (the claimed device is in the reading),
		// not under the device it tried to speak for.
		h.refuse(DeadItem{Reason: ReasonDeviceNotAllowed, Detail: detail, HasReading: true, Reading: r}, h.device)
		return
	}
	if h.local {
		// The gateway's own sensor: polled and journaled at once, so its
		// time is the event's. (The Unix ms in its payload would also
		// read as seconds while the clock is near 1970.)
		r.Time, r.Timing = h.now, aggregate.GatewayTime
	}
	if r.Timing == aggregate.GatewayTime && !h.g.tl.Synchronized {
		if h.g.holding() && r.Device != "" && r.Metric != "" {
			hr := heldReading{device: r.Device, metric: r.Metric, unit: r.Unit, value: r.Value, delta: r.Time.Sub(h.now).Nanoseconds()}
			switch h.g.admitHeld(hr) {
			case holdIt:
				h.held = append(h.held, hr)
				return
			case holdRefused:
				if !h.Counted(payload.Reason(aggregate.TooManySeries.String())) {
					h.refuse(DeadItem{Reason: aggregate.TooManySeries.String(), Detail: outcomeDetail(aggregate.TooManySeries) + " (counting the series held until the clock is synchronized)",
						HasReading: true, Reading: r}, r.Device)
				}
				return
			}
			// Over its device's share of the hold: aggregated now.
		}
		r.Timing = aggregate.UnverifiedTime // clock.hold_max_bytes: 0, or over the device's share
	}
	o := h.g.agg.Add(r)
	if o.Accepted() || h.Counted(payload.Reason(o.String())) {
		return
	}
	h.refuse(DeadItem{Reason: o.String(), Detail: outcomeDetail(o), HasReading: true, Reading: r}, r.Device)
}

func (h *ingestHandler) Reject(e *payload.Error) {
	h.g.countRejected(e)
	h.refuse(DeadItem{Reason: string(e.Reason), Item: e.Item, Detail: e.Detail}, "")
	h.withPayload()
}

// Counted counts a refusal without its details when the dead letter
// would keep none of them (sparkplug.Handler, payload.Counter): it lists
// MaxDeadItems items, and reason is among its reasons already. Past
// that, a publication of many refused items (Sparkplug metrics, JSON
// fields, SenML records, readings the aggregator refuses) costs a count
// each, not a description. A reason that is not the decoder's (the
// aggregator's, device_not_allowed) is counted by its own counter.
func (h *ingestHandler) Counted(reason payload.Reason) bool {
	d := &h.dl
	if len(d.Items) < MaxDeadItems {
		return false
	}
	c := &h.counted
	if c.dead < 0 || c.reason != reason {
		c.dead = slices.IndexFunc(d.Reasons, func(r DeadReason) bool { return r.Reason == string(reason) })
		if c.dead < 0 {
			return false
		}
		c.reason, c.rejected = reason, reasonIndex(reason)
	}
	if c.rejected >= 0 {
		h.g.rejected[c.rejected].Add(1)
	}
	d.ItemsTotal++
	d.Reasons[c.dead].Count++
	return true
}

// refuse adds one refused item to the publication's dead letter.
func (h *ingestHandler) refuse(it DeadItem, device string) {
	d := &h.dl
	detail := func() string {
		if it.Item != "" {
			return it.Item + ": " + it.Detail
		}
		return it.Detail
	}
	if d.Reason == "" {
		d.Reason, d.Detail = it.Reason, detail()
		if it.HasReading {
			d.HasReading, d.Reading = true, it.Reading
		}
	}
	if d.Device == "" {
		d.Device = device
	}
	d.ItemsTotal++
	if len(d.Items) < MaxDeadItems {
		d.Items = append(d.Items, it)
	}
	for i := range d.Reasons {
		if d.Reasons[i].Reason == it.Reason {
			d.Reasons[i].Count++
			return
		}
	}
	d.Reasons = append(d.Reasons, DeadReason{Reason: it.Reason, Count: 1, Detail: detail()})
}

// withPayload puts the payload in the dead letter, once, cut to
// Options.DeadLetterPayload bytes (at a character boundary when it is
// text), with its length and hash.
func (h *ingestHandler) withPayload() {
	if h.payOnce {
		return
	}
	h.payOnce = true
	body := h.payload
	n := min(len(body), h.g.opts.DeadLetterPayload)
	if n < len(body) && utf8.Valid(body) {
		for n > 0 && !utf8.RuneStart(body[n]) {
			n--
		}
	}
	h.dl.Payload = append(h.dl.Payload[:0], body[:n]...)
	h.dl.PayloadBytes = len(body)
	h.dl.PayloadSHA256 = sha256.Sum256(body)
}

func outcomeDetail(o aggregate.Outcome) string {
	switch o {
	case aggregate.TooLate:
		return "reading is later than aggregate.allowed_lateness behind its device's watermark"
	case aggregate.Future:
		return "reading is stamped further ahead of the gateway clock than aggregate.max_future_skew"
	case aggregate.DeviceClockUnset:
		return "the device stamped the reading before any real reading can be (its clock was never set: set it by NTP or SNTP); " +
			"with aggregate.untrusted_device_time: arrival it is stamped on arrival while the gateway clock is synchronized"
	case aggregate.GatewayClockUnset:
		return "the gateway stamped the reading and its own clock is before any real reading can be: synchronize it (chrony or systemd-timesyncd)"
	case aggregate.Evicted:
		return "the window's state was evicted (aggregate.max_retained_windows), so it cannot be revised"
	case aggregate.Invalid:
		return "reading has no device or metric name, or a non-finite value"
	case aggregate.TooManySeries:
		return "a new series over aggregate.max_metrics_per_device for its device, aggregate.max_series in all, or a new device over aggregate.max_devices"
	}
	return ""
}

// ingestLocked decodes one journaled publication into readings and
// aggregates them, with g.mu held. now is its arrival time. Whatever it
// refuses, for however many reasons, makes one dead letter.
func (g *Gateway) ingestLocked(topic, client string, body []byte, now time.Time) {
	h := &g.ing
	h.topic, h.client, h.payload, h.now = topic, client, body, now
	var matched bool
	var err error
	if t, ok := g.sparkplugTopic(topic); ok {
		matched = true
		g.ingestSparkplug(t, body, now, h)
	} else {
		matched, err = g.dec.Decode(topic, body, now, h)
	}
	if err != nil {
		var e *payload.Error
		if errors.As(err, &e) {
			h.Reject(e)
		}
	}
	if h.dl.Reason != "" {
		d := &h.dl
		if d.Device == "" {
			d.Device = g.topicDevice(topic)
		}
		d.Source, d.Topic, d.Client, d.ReceivedAt = "mqtt", topic, client, now
		g.emitDeadLetter(*d)
		g.logRejected(d.Reason, topic, client, d.Detail, d.ItemsTotal, now)
		// Keep the buffers for the next publication; the Output has
		// encoded what it needs.
		*d = DeadLetter{Payload: d.Payload[:0], Reasons: d.Reasons[:0], Items: clearItems(d.Items)}
	}
	h.payload, h.payOnce, h.counted.dead = nil, false, -1
	g.holdPublication(topic, client)
	if matched {
		g.publishes.Add(1)
	}
}

func clearItems(items []DeadItem) []DeadItem {
	clear(items)
	return items[:0]
}

// countRejected counts a decoder refusal by reason.
func (g *Gateway) countRejected(e *payload.Error) {
	if i := reasonIndex(e.Reason); i >= 0 {
		g.rejected[i].Add(1)
	}
}

// topicDevice returns the device the topic names, if any.
func (g *Gateway) topicDevice(topic string) string {
	if d, ok := g.sparkplugDevice(topic); ok {
		return d
	}
	for _, p := range g.dec.Patterns() {
		if d, _, ok := p.Match(topic); ok {
			return d
		}
	}
	return ""
}

func (g *Gateway) logRejected(reason, topic, client, detail string, items int, now time.Time) {
	if ok, held := g.logLimiter.Allow(reason, now); ok {
		g.log.Warn("reading refused; sent to dead letters", "reason", reason, "topic", topic, "client", client,
			"detail", detail, "items", items, "suppressed_since_last", held)
	}
}
