package aggregate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Snapshot encodes the aggregator's whole state (devices, watermarks, open
// and retained windows, counters; with a Store, retained windows are left
// to the store) so that Restore can rebuild it: an
// aggregator restored from a snapshot and fed the readings that followed
// emits exactly what the original would have. The encoding is private to
// this package and versioned; a snapshot taken under another window length
// or out-of-order bound is refused by Restore.
func (a *Aggregator) Snapshot() []byte { return a.AppendSnapshot(nil) }

// AppendSnapshot appends the Snapshot to b.
func (a *Aggregator) AppendSnapshot(b []byte) []byte {
	// About 100 bytes per window; growing the buffer by doubling costs as
	// much as encoding.
	n := len(a.series) + len(a.devList)/2
	if a.store == nil {
		n += len(a.retained)
	}
	e := encoder{buf: slices.Grow(b, 64+n*112)}
	e.u(snapshotVersion)
	e.i(int64(a.cfg.Window))
	e.i(int64(a.cfg.MaxOutOfOrder))
	for _, n := range a.counts.Readings {
		e.u(n)
	}
	e.u(a.counts.Summaries)
	e.u(a.counts.Evictions)
	e.u(uint64(len(a.devList)))
	for _, d := range a.devList {
		e.s(d.id)
		e.i(d.maxEvent)
		e.b(d.hasEvent)
		e.i(d.lastSeen)
		e.i(d.lastSeenAt)
		e.i(d.closedTo)
		e.u(uint64(len(d.series)))
		for _, s := range d.series {
			e.s(s.metric)
			e.b(s.evicted)
			e.i(s.evictEnd)
			e.u(uint64(len(s.open)))
			for _, w := range s.open {
				e.window(w)
			}
		}
	}
	// Retained windows in closing order, so eviction order survives. With a
	// Store they are in the store (the owner takes the dirty ones with the
	// snapshot), and the RAM cache is not state.
	var live []retainedKey
	for _, k := range a.order[a.head:] {
		if _, ok := a.retained[k]; ok && a.store == nil {
			live = append(live, k)
		}
	}
	e.u(uint64(len(live)))
	for _, k := range live {
		e.s(k.dev)
		e.s(k.metric)
		e.window(a.retained[k])
	}
	return e.buf
}

// snapshotVersion 2 added the TooManySeries counter; 3 the clock-unset
// counters, each device's elapsed time of its last reading (lastSeen, until
// then its wall time), its wall time (lastSeenAt) and the end of the latest
// window it closed (closedTo), and each window's readings by Timing.
// Restore reads 1 and 2 too.
const snapshotVersion = 3

// ErrSnapshot is returned by Restore for a snapshot it cannot use.
var ErrSnapshot = errors.New("aggregate: unusable snapshot")

// Restore replaces the state of a (new) aggregator with the snapshot's.
func (a *Aggregator) Restore(snap []byte) error {
	d := decoder{buf: snap}
	v := d.u()
	if v < 1 || v > snapshotVersion {
		return fmt.Errorf("%w: version %d", ErrSnapshot, v)
	}
	d.version = v
	if w, ooo := d.i(), d.i(); w != int64(a.cfg.Window) || ooo != int64(a.cfg.MaxOutOfOrder) {
		if d.err == nil {
			return fmt.Errorf("%w: taken with window %v and max_out_of_order %v", ErrSnapshot, w, ooo)
		}
	}
	fresh, _ := New(a.cfg, a.clk, a.emit)
	outcomes := len(fresh.counts.Readings)
	switch v {
	case 1:
		outcomes = int(TooManySeries) // counters up to Invalid
	case 2:
		outcomes = int(DeviceClockUnset) // up to TooManySeries
	}
	elapsed := int64(a.clk.Elapsed())
	for i := range outcomes {
		fresh.counts.Readings[i] = d.u()
	}
	fresh.counts.Summaries = d.u()
	fresh.counts.Evictions = d.u()
	nd := d.n()
	for range nd {
		dev := &device{id: d.s(), maxEvent: d.i(), hasEvent: d.bool(), lastSeen: d.i()}
		if v >= 3 {
			dev.lastSeenAt, dev.closedTo = d.i(), d.i()
		} else {
			// lastSeen was the wall clock: idle time is measured from
			// now on, or from then if that is earlier by the clock given.
			dev.lastSeenAt, dev.lastSeen = dev.lastSeen, min(dev.lastSeen, elapsed)
			// Any window up to the one of its latest reading may have
			// been closed by the shutdown.
			if dev.hasEvent {
				dev.closedTo = fresh.windowStart(dev.maxEvent) + fresh.window
			}
		}
		ns := d.n()
		dev.minEnd = math.MaxInt64
		for range ns {
			s := &series{dev: dev, metric: d.s(), evicted: d.bool(), evictEnd: d.i()}
			nw := d.n()
			for range nw {
				w := d.window()
				s.open = append(s.open, w)
				dev.open++
				dev.minEnd = min(dev.minEnd, w.start+fresh.window)
			}
			dev.series = append(dev.series, s)
			fresh.series[seriesKey{dev.id, s.metric}] = s
		}
		// Older snapshots kept series in order of first reading.
		slices.SortFunc(dev.series, func(x, y *series) int { return strings.Compare(x.metric, y.metric) })
		fresh.devices[dev.id] = dev
		fresh.devList = append(fresh.devList, dev)
	}
	nr := d.n()
	for range nr {
		devID, metric := d.s(), d.s()
		w := d.window()
		s, ok := fresh.series[seriesKey{devID, metric}]
		if !ok {
			if d.err == nil {
				d.err = fmt.Errorf("retained window of unknown series %s/%s", devID, metric)
			}
			break
		}
		k := retainedKey{s.dev.id, s.metric, w.start}
		fresh.retained[k] = w
		s.retained++
		fresh.order = append(fresh.order, k)
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.buf))
	}
	if d.err != nil {
		return fmt.Errorf("%w: %w", ErrSnapshot, d.err)
	}
	fresh.store = a.store
	*a = *fresh
	return nil
}

type encoder struct{ buf []byte }

func (e *encoder) u(v uint64) { e.buf = binary.AppendUvarint(e.buf, v) }
func (e *encoder) i(v int64)  { e.buf = binary.AppendVarint(e.buf, v) }
func (e *encoder) f(v float64) {
	e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(v))
}
func (e *encoder) s(v string) { e.u(uint64(len(v))); e.buf = append(e.buf, v...) }
func (e *encoder) b(v bool) {
	if v {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
}

func (e *encoder) window(w *window) {
	e.i(w.start)
	e.i(w.count)
	for _, f := range [...]float64{w.min, w.max, w.sum, w.mean, w.m2, w.first, w.last} {
		e.f(f)
	}
	e.i(w.firstT)
	e.i(w.lastT)
	e.i(w.late)
	e.i(int64(w.revision))
	e.s(w.unit)
	e.i(w.devTimed)
	e.i(w.replaced)
	e.i(w.rebased)
	e.i(w.unverified)
}

// decoder reads what encoder wrote; the first error sticks and later reads
// return zero values.
type decoder struct {
	buf     []byte
	err     error
	version uint64 // of the snapshot
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or corrupt %s", what)
	}
	d.buf = nil
}

func (d *decoder) u() uint64 {
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// n reads a count, bounded by the bytes left so that a corrupt count cannot
// make Restore allocate or loop without end.
func (d *decoder) n() int {
	v := d.u()
	if v > uint64(len(d.buf)) {
		d.fail("count")
		return 0
	}
	return int(v)
}

func (d *decoder) i() int64 {
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) f() float64 {
	if len(d.buf) < 8 {
		d.fail("float")
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.buf))
	d.buf = d.buf[8:]
	return v
}

func (d *decoder) s() string {
	n := d.n()
	if d.err != nil {
		return ""
	}
	v := string(d.buf[:n])
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) bool() bool {
	if len(d.buf) < 1 || d.buf[0] > 1 {
		d.fail("flag")
		return false
	}
	v := d.buf[0] == 1
	d.buf = d.buf[1:]
	return v
}

func (d *decoder) window() *window {
	w := &window{start: d.i(), count: d.i()}
	w.min, w.max, w.sum, w.mean, w.m2, w.first, w.last = d.f(), d.f(), d.f(), d.f(), d.f(), d.f(), d.f()
	w.firstT, w.lastT, w.late = d.i(), d.i(), d.i()
	w.revision = int(d.i())
	w.unit = d.s()
	if d.version >= 3 {
		w.devTimed, w.replaced, w.rebased, w.unverified = d.i(), d.i(), d.i(), d.i()
	} else {
		w.devTimed = w.count // before Timing: taken as the devices' times
	}
	return w
}
