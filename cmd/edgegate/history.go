package main

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// The history keeps the last hour of the gateway's counters, sampled every
// historyStep: the status page's charts draw it (/api/history), and the
// figures every view shows (readings a minute, the drain ETA; see
// figures) are taken against it. It holds historyLen samples of a few
// counters, the dead letters by reason (at most maxDeadReasons) and the
// readings of the first maxDeviceMetrics devices: under 500 KB.
const (
	historyStep = 10 * time.Second
	historyLen  = 361 // an hour of steps, and the sample that begins it
	// rateWindow is what a rate is taken over: the last minute, or the
	// time since start when that is shorter, but never less than
	// minRateSpan (a rate over a second or two says little).
	rateWindow  = time.Minute
	minRateSpan = 10 * time.Second
)

// snap is the counters at one moment; dead and devices are indexed by
// history.reasons and history.devices.
type snap struct {
	at        time.Time // status.clock(): with the monotonic clock's reading
	readings  uint64    // readings taken, whatever their outcome
	summaries uint64
	delivered uint64
	queued    uint64
	oldest    time.Duration
	dead      []uint64
	devices   []uint64 // readings aggregated and revisions
}

// history is a ring of samples, oldest first.
type history struct {
	mu        sync.Mutex
	samples   []snap
	reasons   []string
	reasonIdx map[string]int
	devices   []string
	deviceIdx map[string]int
}

func newHistory() *history {
	return &history{reasonIdx: map[string]int{}, deviceIdx: map[string]int{}}
}

// readingsTaken is every reading the aggregator was given.
func readingsTaken(st status) uint64 {
	var n uint64
	for _, v := range st.MQTT.Outcomes {
		n += v
	}
	return n
}

// add records st, taken at st.clock().
func (h *history) add(st status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := snap{at: st.clock(), readings: readingsTaken(st), summaries: st.MQTT.Summaries,
		delivered: st.Kafka.Delivered, queued: st.Kafka.Queued, oldest: st.Kafka.OldestAge}
	for _, r := range slices.Sorted(maps.Keys(st.MQTT.DeadLetters)) {
		if _, ok := h.reasonIdx[r]; !ok {
			h.reasonIdx[r] = len(h.reasons)
			h.reasons = append(h.reasons, r)
		}
	}
	s.dead = make([]uint64, len(h.reasons))
	for r, n := range st.MQTT.DeadLetters {
		if i, ok := h.reasonIdx[r]; ok {
			s.dead[i] = n
		}
	}
	for _, d := range st.MQTT.DeviceList {
		if _, ok := h.deviceIdx[d.ID]; !ok && len(h.devices) < maxDeviceMetrics {
			h.deviceIdx[d.ID] = len(h.devices)
			h.devices = append(h.devices, d.ID)
		}
	}
	s.devices = make([]uint64, len(h.devices))
	for _, d := range st.MQTT.DeviceList {
		if i, ok := h.deviceIdx[d.ID]; ok {
			s.devices[i] = d.Aggregated + d.Revised
		}
	}
	if len(h.samples) == historyLen {
		h.samples = append(h.samples[:0], h.samples[1:]...)
	}
	h.samples = append(h.samples, s)
}

// base returns the sample a rate at now is taken against: the newest at
// least rateWindow old, else the oldest (the first after start).
func (h *history) base(now time.Time) (snap, bool) {
	if len(h.samples) == 0 {
		return snap{}, false
	}
	b := h.samples[0]
	for _, s := range h.samples {
		if now.Sub(s.at) < rateWindow {
			break
		}
		b = s
	}
	return b, true
}

// at returns the counter of slice i of s, zero where the sample is older
// than the name.
func at(xs []uint64, i int) uint64 {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// histPoint is one step of the charts.
type histPoint struct {
	At             time.Time `json:"at"`
	ReadingsPerS   float64   `json:"readings_per_s"`
	SummariesPerS  float64   `json:"summaries_per_s"`
	DeliveredPerS  float64   `json:"delivered_per_s"`
	Queued         uint64    `json:"queued"`
	LagSeconds     float64   `json:"lag_seconds"`
	StepSeconds    float64   `json:"step_seconds"`
	ReadingsInStep uint64    `json:"readings"`
}

// historyView is /api/history: the charts' data.
type historyView struct {
	StepSeconds float64 `json:"step_seconds"`
	// Latest is when the latest sample was taken (zero before the first).
	Latest time.Time `json:"latest"`
	// Points are the steps between samples, oldest first: rates over each
	// step, the queue and the oldest record's age at its end.
	Points []histPoint `json:"points"`
	// Minutes are the starts of the minutes that DeadLetters counts by,
	// oldest first, at least the last five; the last is the current one.
	Minutes []time.Time `json:"minutes"`
	// DeadLetters is dead letters by reason, by minute of Minutes.
	DeadLetters map[string][]uint64 `json:"dead_letters"`
	// DeviceMinutes are the whole minutes the samples cover (not the
	// current one, nor any before the gateway started), and Devices the
	// readings of each device in each of them: the first
	// maxDeviceMetrics devices.
	DeviceMinutes []time.Time         `json:"device_minutes"`
	Devices       map[string][]uint64 `json:"devices"`
}

// minDeadMinutes is the least span of the by-minute charts: a gateway a
// minute old still draws the minute before this one.
const minDeadMinutes = 5

// view returns the charts' data as of now (time.Now(): its monotonic
// reading places the samples on today's wall clock, however it stepped
// since they were taken).
func (h *history) view(now time.Time) historyView {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := historyView{StepSeconds: historyStep.Seconds(), DeadLetters: map[string][]uint64{}, Devices: map[string][]uint64{}}
	wall := func(t time.Time) time.Time { return now.UTC().Add(-now.Sub(t)) }
	for i := 1; i < len(h.samples); i++ {
		a, b := h.samples[i-1], h.samples[i]
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 {
			continue
		}
		v.Points = append(v.Points, histPoint{At: wall(b.at), StepSeconds: dt,
			ReadingsPerS:   float64(b.readings-a.readings) / dt,
			SummariesPerS:  float64(b.summaries-a.summaries) / dt,
			DeliveredPerS:  float64(b.delivered-a.delivered) / dt,
			Queued:         b.queued,
			LagSeconds:     b.oldest.Seconds(),
			ReadingsInStep: b.readings - a.readings})
	}
	if len(h.samples) == 0 {
		return v
	}
	v.Latest = wall(h.samples[len(h.samples)-1].at)
	cur := now.UTC().Truncate(time.Minute)
	first := wall(h.samples[0].at).Truncate(time.Minute)
	if least := cur.Add(-(minDeadMinutes - 1) * time.Minute); least.Before(first) {
		first = least
	}
	if most := cur.Add(-time.Hour); first.Before(most) { // an hour's samples span an hour
		first = most
	}
	for m := first; !m.After(cur); m = m.Add(time.Minute) {
		v.Minutes = append(v.Minutes, m)
	}
	// upTo[i] is the sample that counts up to the start of minute i (i up
	// to len(Minutes), the end of the last): the newest at or before it.
	// found[i] is false when there is none (the first sample then stands
	// for all before it: what a replay counted at start is not this
	// minute's). One pass over the samples, which are in time order.
	upTo := make([]*snap, len(v.Minutes)+1)
	found := make([]bool, len(v.Minutes)+1)
	j := 0
	for i := range upTo {
		end := first.Add(time.Duration(i) * time.Minute)
		for j < len(h.samples) && !wall(h.samples[j].at).After(end) {
			j++
		}
		upTo[i], found[i] = &h.samples[max(j-1, 0)], j > 0
	}
	last := &h.samples[len(h.samples)-1]
	for ri, r := range h.reasons {
		counts := make([]uint64, len(v.Minutes))
		var any bool
		for mi := range v.Minutes {
			if !found[mi+1] {
				continue
			}
			hi := upTo[mi+1]
			if mi == len(v.Minutes)-1 {
				hi = last
			}
			counts[mi] = at(hi.dead, ri) - at(upTo[mi].dead, ri)
			any = any || counts[mi] > 0
		}
		if any {
			v.DeadLetters[r] = counts
		}
	}
	// A device's minutes are the whole minutes the samples cover: none
	// before the first sample (the gateway was not running), nor the
	// current one.
	var devMinutes []int
	for mi, m := range v.Minutes {
		if !m.Before(wall(h.samples[0].at)) && !m.Add(time.Minute).After(wall(last.at)) {
			v.DeviceMinutes = append(v.DeviceMinutes, m)
			devMinutes = append(devMinutes, mi)
		}
	}
	for di, d := range h.devices {
		counts := make([]uint64, len(devMinutes))
		for k, mi := range devMinutes {
			counts[k] = at(upTo[mi+1].devices, di) - at(upTo[mi].devices, di)
		}
		v.Devices[d] = counts
	}
	return v
}
