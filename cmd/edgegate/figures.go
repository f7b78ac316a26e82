package main

import (
	"fmt"
	"math"
	"time"

	"github.com/edgegate/edgegate/bridge"
)

// figures are what the gateway works out from its counters and their
// history: the link's state, the drain ETA, rates and readings a minute.
// They are computed once per snapshot (pipeline.status), and the four
// views show that snapshot: /api/status carries them, the status page and
// `edgegate status` print them as they come (each text is made here, so
// both say it the same way), and /metrics exposes their numbers.
type figures struct {
	Link  linkFigure  `json:"link"`
	Drain drainFigure `json:"drain"`
	Rates rates       `json:"rates"`
	// Devices are the readings a minute of the devices the history
	// follows (the first maxDeviceMetrics), by id.
	Devices map[string]deviceFigure `json:"devices"`
}

// linkFigure is the link to Kafka as bridge.Stats says it.
type linkFigure struct {
	State   bridge.LinkState `json:"state"`
	Since   time.Time        `json:"since"`
	Error   string           `json:"error,omitempty"`
	Checked time.Time        `json:"checked"`
	// Text is the state in words: "up", "idle (…)", "connecting",
	// "down: <error> since <time>".
	Text string `json:"text"`
}

// rates are per second over the last minute, or since start when that is
// shorter; none before minRateSpan (OverSeconds 0).
type rates struct {
	OverSeconds   float64 `json:"over_seconds"`
	ReadingsPerS  float64 `json:"readings_per_s"`
	SummariesPerS float64 `json:"summaries_per_s"`
	DeliveredPerS float64 `json:"delivered_per_s"`
	// Over says what they are over: "last minute" or "over the first 19 s".
	Over string `json:"over"`
}

// drainFigure says whether and when the outbound queue empties.
type drainFigure struct {
	// State is "empty", "draining" (ETASeconds is set), "waiting" (records
	// queued less than a minute ago, on a link that is not down: the
	// forwarder has not had its turn yet) or "not draining" (the link is
	// down, or nothing was delivered for a minute while records waited).
	State      string   `json:"state"`
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// ETA is the ETA in short ("2 min"), or the state when not draining;
	// Text says it in full.
	ETA  string `json:"eta"`
	Text string `json:"text"`
}

// deviceFigure is one device's rate.
type deviceFigure struct {
	// ReadingsPerMin is readings aggregated or revising a window, a
	// minute, over OverSeconds (the last minute, or since start); nil
	// before minRateSpan.
	ReadingsPerMin *float64 `json:"readings_per_min"`
	OverSeconds    float64  `json:"over_seconds"`
	// Text is the figure as the views print it: "176.3", "176.3 (over the
	// first 19 s)" or "–".
	Text string `json:"text"`
}

// Drain states.
const (
	drainEmpty    = "empty"
	drainDraining = "draining"
	drainWaiting  = "waiting"
	drainStuck    = "not draining"
)

// fmtAge is a duration as every view writes it: "45 s", "3 min", "1.5 h".
func fmtAge(d time.Duration) string {
	s := d.Seconds()
	switch {
	case s < 60:
		return fmt.Sprintf("%.0f s", s)
	case s < 3600:
		return fmt.Sprintf("%.0f min", s/60)
	}
	return fmt.Sprintf("%.1f h", s/3600)
}

// computeFigures works the figures out from st (taken at st.clock()), the
// history and when the gateway started.
func computeFigures(st status, h *history) figures {
	now := st.clock()
	k := st.Kafka
	f := figures{Devices: map[string]deviceFigure{}}
	f.Link = linkFigure{State: k.Link, Since: k.LinkSince, Error: k.LinkError, Checked: k.LinkChecked}
	switch k.Link {
	case bridge.LinkDown:
		f.Link.Text = fmt.Sprintf("down: %s (since %s, %s ago)", k.LinkError, k.LinkSince.UTC().Format(time.TimeOnly+" MST"), fmtAge(now.Sub(k.LinkSince)))
	case bridge.LinkIdle:
		f.Link.Text = fmt.Sprintf("idle: reachable, nothing to send (checked %s ago)", fmtAge(now.Sub(k.LinkChecked)))
	case bridge.LinkConnecting:
		f.Link.Text = fmt.Sprintf("connecting (for %s)", fmtAge(now.Sub(k.LinkSince)))
	default:
		f.Link.Text = string(k.Link)
	}

	h.mu.Lock()
	base, ok := h.base(now)
	devIdx := h.deviceIdx
	var over time.Duration
	if ok {
		over = now.Sub(base.at)
	}
	if ok && over >= minRateSpan {
		s := over.Seconds()
		f.Rates = rates{OverSeconds: s,
			ReadingsPerS:  float64(readingsTaken(st)-base.readings) / s,
			SummariesPerS: float64(st.MQTT.Summaries-base.summaries) / s,
			DeliveredPerS: float64(k.Delivered-base.delivered) / s,
			Over:          overText(over)}
		for _, d := range st.MQTT.DeviceList {
			i, ok := devIdx[d.ID]
			if !ok {
				continue
			}
			perMin := float64(d.Aggregated+d.Revised-at(base.devices, i)) / s * 60
			text := fmt.Sprintf("%.1f", perMin)
			if over < rateWindow-time.Second {
				text += " (" + overText(over) + ")"
			}
			f.Devices[d.ID] = deviceFigure{ReadingsPerMin: &perMin, OverSeconds: s, Text: text}
		}
	}
	h.mu.Unlock()

	f.Drain = drain(k, f.Rates)
	return f
}

// overText says what a rate is over.
func overText(over time.Duration) string {
	if over >= rateWindow-time.Second {
		return "last minute"
	}
	return "over the first " + fmtAge(over)
}

// drain works out the drain state (see drainFigure).
func drain(k bridge.Stats, r rates) drainFigure {
	rate := ""
	if r.OverSeconds > 0 {
		rate = fmt.Sprintf(" at %.1f records/s (%s)", r.DeliveredPerS, r.Over)
	}
	d := drainOf(k, r, rate)
	d.ETA = d.State
	if d.ETASeconds != nil {
		d.ETA = fmtAge(time.Duration(*d.ETASeconds * float64(time.Second)))
	}
	return d
}

func drainOf(k bridge.Stats, r rates, rate string) drainFigure {
	switch {
	case k.Queued == 0:
		return drainFigure{State: drainEmpty, Text: drainEmpty + rate}
	case k.Link == bridge.LinkDown:
		return drainFigure{State: drainStuck, Text: fmt.Sprintf("not draining: the link is down; %d records wait, the oldest for %s", k.Queued, fmtAge(k.OldestAge))}
	case r.DeliveredPerS > 0:
		eta := float64(k.Queued) / r.DeliveredPerS
		return drainFigure{State: drainDraining, ETASeconds: &eta, Text: "about " + fmtAge(time.Duration(eta*float64(time.Second))) + rate}
	case k.OldestAge < rateWindow:
		return drainFigure{State: drainWaiting, Text: fmt.Sprintf("waiting: %d records queued, the oldest %s ago", k.Queued, fmtAge(k.OldestAge))}
	}
	return drainFigure{State: drainStuck, Text: fmt.Sprintf("not draining: nothing delivered for a minute; %d records wait, the oldest for %s", k.Queued, fmtAge(k.OldestAge))}
}

// etaMetric is the drain ETA as /metrics has it: 0 when empty, +Inf when
// not draining, NaN while waiting (not known yet).
func (d drainFigure) etaMetric() float64 {
	switch d.State {
	case drainEmpty:
		return 0
	case drainDraining:
		return *d.ETASeconds
	case drainWaiting:
		return math.NaN()
	}
	return math.Inf(1)
}
