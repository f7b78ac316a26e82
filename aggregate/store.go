package aggregate

import (
	"maps"
	"math"
	"slices"
)

// WindowState is a closed window as a Store keeps it: everything needed to
// revise it with later readings.
type WindowState struct {
	Start                   int64 // Unix ns
	Count                   int64
	Min, Max, Sum, Mean, M2 float64
	FirstT, LastT           int64 // event times of First and Last, Unix ns
	First, Last             float64
	Late                    int64
	Revision                int // of the next summary to emit
	Unit                    string
	// Readings by Timing: DeviceTimed with DeviceTime; of the others,
	// Replaced, Rebased and Unverified ones.
	DeviceTimed, Replaced, Rebased, Unverified int64
}

// Store keeps closed windows outside RAM, so that readings hours late can
// still revise them. With a store the aggregator keeps only a cache of
// closed windows (Config.MaxRetained of them, plus those changed since
// TakeDirty), and loads the others on demand. The owner writes what
// TakeDirty hands over and deletes what Horizons says can no longer be
// revised, together with a Snapshot, so that the store and the snapshot
// always describe the same moment.
type Store interface {
	// Load returns the stored window of device and metric that starts at
	// start (Unix ns), if any.
	Load(device, metric string, start int64) (WindowState, bool, error)
}

// SetStore makes a keep closed windows in s. Call it before the first
// reading (or right after Restore). Windows evicted from RAM are then not
// lost: outcome Evicted only reports a store that failed to load.
func (a *Aggregator) SetStore(s Store) { a.store = s }

// TakeDirty calls fn with every retained window created or revised since
// the last call, and marks them clean: from then on the cache may drop
// them, so fn must have stored them (or the caller must hold the
// aggregator until it has).
func (a *Aggregator) TakeDirty(fn func(device, metric string, w WindowState)) {
	for _, k := range a.order[a.head:] {
		w, ok := a.retained[k]
		if !ok || !w.dirty {
			continue
		}
		w.dirty = false
		fn(k.dev, k.metric, w.state())
	}
	a.trimCache()
}

// Horizons calls fn, for every device, with the start time (Unix ns)
// below which the closed windows of its series can no longer be revised:
// they may be deleted from the store. It is per device, since series
// without open windows are not kept in RAM. A device dropped by Forget
// (and not made again since) is reported once, with math.MaxInt64: its
// stored windows go.
func (a *Aggregator) Horizons(fn func(device string, before int64)) {
	for _, dev := range slices.Sorted(maps.Keys(a.forgotten)) {
		fn(dev, math.MaxInt64)
	}
	clear(a.forgotten)
	for _, d := range a.devList {
		if !d.hasEvent {
			continue
		}
		fn(d.id, d.watermark(a.cfg.MaxOutOfOrder)-int64(a.cfg.AllowedLateness)-a.window+1)
	}
}

// trimCache drops clean retained windows, oldest closed first, while the
// cache is over MaxRetained. A dirty window at the head stops it: it stays
// until the next TakeDirty.
func (a *Aggregator) trimCache() {
	for len(a.retained) > a.cfg.MaxRetained && a.head < len(a.order) {
		k := a.order[a.head]
		if w, ok := a.retained[k]; ok && w.dirty {
			return
		}
		a.popOldest(false)
	}
}

func (w *window) state() WindowState {
	return WindowState{Start: w.start, Count: w.count, Min: w.min, Max: w.max, Sum: w.sum, Mean: w.mean, M2: w.m2,
		FirstT: w.firstT, LastT: w.lastT, First: w.first, Last: w.last, Late: w.late, Revision: w.revision, Unit: w.unit,
		DeviceTimed: w.devTimed, Replaced: w.replaced, Rebased: w.rebased, Unverified: w.unverified}
}

func (a *Aggregator) windowFrom(st WindowState) *window {
	w := a.newWindow(st.Start)
	w.count, w.min, w.max, w.sum, w.mean, w.m2 = st.Count, st.Min, st.Max, st.Sum, st.Mean, st.M2
	w.firstT, w.lastT, w.first, w.last, w.late, w.revision, w.unit = st.FirstT, st.LastT, st.First, st.Last, st.Late, st.Revision, st.Unit
	w.devTimed, w.replaced, w.rebased, w.unverified = st.DeviceTimed, st.Replaced, st.Rebased, st.Unverified
	return w
}
