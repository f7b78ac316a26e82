// Package aggregate turns a stream of sensor readings into per-device,
// per-metric summaries over tumbling event-time windows.
//
// It owns the windowing semantics of SPEC.md ("Semantics: Windows"): windows
// are aligned to the Unix epoch; every device has its own watermark (its
// latest event time minus MaxOutOfOrder); a silent device's windows close
// after IdleClose of elapsed (monotonic) time, so that no step of the wall
// clock freezes or floods them; readings behind the watermark but within
// AllowedLateness produce a new, accumulating revision of their window; later
// readings, readings stamped more than MaxFutureSkew ahead of the
// synchronized clock, and readings stamped before TimeFloor (a clock that
// was never set) are refused with a reason. Every reading ends in exactly
// one Outcome.
//
// The package imports only the standard library and does no I/O. Time comes
// from an injected Clock. An Aggregator is not safe for concurrent use: the
// caller serialises Add and Tick.
package aggregate

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Reading is one measured value of one metric of one device.
type Reading struct {
	Device string
	Metric string
	Unit   string // may be empty
	Time   time.Time
	Value  float64
	// Timing says where Time came from; the zero value is the device's
	// own clock.
	Timing Timing
}

// Timing says where a reading's time came from, and how far it can be
// trusted. Summaries count their readings by it.
type Timing uint8

const (
	// DeviceTime: the device stamped the reading.
	DeviceTime Timing = iota
	// GatewayTime: the gateway stamped it on arrival (a payload without
	// a time, the gateway's own sensors), with its synchronized clock.
	GatewayTime
	// ReplacedTime: the device stamped it before TimeFloor (its clock was
	// never set), and the gateway stamped it on arrival instead. Set by
	// the aggregator (UntrustedArrival), not by callers.
	ReplacedTime
	// RebasedTime: the gateway stamped it on arrival while its own clock
	// was not synchronized, and re-based it to true time (by the
	// monotonic clock) once the clock was.
	RebasedTime
	// UnverifiedTime: the gateway stamped it while its own clock was not
	// synchronized, and the clock was not synchronized in time to check
	// it.
	UnverifiedTime

	numTimings
)

// Outcome says what became of a reading. Every reading passed to Add ends in
// exactly one outcome.
type Outcome uint8

const (
	// Aggregated: folded into an open window.
	Aggregated Outcome = iota
	// Revised: behind its device's watermark but within the allowed
	// lateness; folded into its (closed) window, which was emitted again with
	// the next revision number.
	Revised
	// TooLate: its window ended more than AllowedLateness before the
	// device's watermark.
	TooLate
	// Future: stamped more than MaxFutureSkew ahead of the clock.
	Future
	// Evicted: its window's retained state was evicted to respect
	// MaxRetained, so no correct revision can be emitted.
	Evicted
	// Invalid: empty device or metric name, or a value that is not finite.
	Invalid
	// TooManySeries: its series is new and would take its device over
	// MaxMetricsPerDevice series, or the aggregator over MaxSeries series
	// or (for a new device) MaxDevices devices.
	TooManySeries
	// DeviceClockUnset: the device stamped it before TimeFloor (its clock
	// was never set), and it could not be stamped on arrival instead
	// (UntrustedDeadLetter, or the gateway's clock was not synchronized).
	DeviceClockUnset
	// GatewayClockUnset: the gateway stamped it, and the gateway's own
	// clock was before TimeFloor (a gateway booted at 1970 and never
	// synchronized).
	GatewayClockUnset

	numOutcomes
)

// NumOutcomes is the number of outcomes: they run from Aggregated to
// NumOutcomes-1.
const NumOutcomes = int(numOutcomes)

var outcomeNames = [numOutcomes]string{
	Aggregated:        "aggregated",
	Revised:           "late_revised",
	TooLate:           "too_late",
	Future:            "future",
	Evicted:           "late_state_evicted",
	Invalid:           "invalid",
	TooManySeries:     "too_many_series",
	DeviceClockUnset:  "device_clock_unset",
	GatewayClockUnset: "gateway_clock_unset",
}

// String returns the outcome's stable name, used as a metric label and as the
// dead-letter reason.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Accepted reports whether the reading counts in a summary.
func (o Outcome) Accepted() bool { return o == Aggregated || o == Revised }

// Clock is the aggregator's time.
type Clock interface {
	// Now returns the gateway's wall clock, and whether it is
	// synchronized. Readings are judged against it (MaxFutureSkew) and
	// stamped with it (UntrustedArrival) only when it is.
	Now() (t time.Time, synchronized bool)
	// Elapsed reads a clock that never goes backwards and is not stepped
	// with the wall clock (monotonic time): idle closing measures a
	// device's silence with it.
	Elapsed() time.Duration
}

// WallClock is a Clock on one wall clock that is always taken as
// synchronized and measures elapsed time too: for callers, tests among
// them, whose clock is never stepped.
func WallClock(now func() time.Time) Clock { return wallClock(now) }

type wallClock func() time.Time

func (c wallClock) Now() (time.Time, bool) { return c(), true }
func (c wallClock) Elapsed() time.Duration { return time.Duration(c().UnixNano()) }

// UntrustedPolicy says what becomes of a reading whose device stamped it
// before Config.TimeFloor.
type UntrustedPolicy uint8

const (
	// UntrustedArrival stamps it with the gateway's clock on arrival
	// (Timing ReplacedTime) when that clock is synchronized, and refuses
	// it as DeviceClockUnset when not.
	UntrustedArrival UntrustedPolicy = iota
	// UntrustedDeadLetter always refuses it as DeviceClockUnset.
	UntrustedDeadLetter
)

// DefaultTimeFloor is the default Config.TimeFloor: no reading can be
// older than a year before this program was built (the time of its source
// commit when the build recorded one, else 2026-01-01). Clocks that were
// never set count from 1970 or 2000, and a GPS week rollover lands in
// 1999 or 2019: all far below it.
func DefaultTimeFloor() time.Time {
	floor := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key != "vcs.time" {
				continue
			}
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil && t.AddDate(-1, 0, 0).After(floor) {
				floor = t.AddDate(-1, 0, 0).UTC()
			}
		}
	}
	return floor
}

// Config sets the windowing rules. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	Gateway         string        // copied into every summary
	Window          time.Duration // tumbling window length, aligned to the epoch
	MaxOutOfOrder   time.Duration // watermark = latest event time - this
	IdleClose       time.Duration // close a silent device's windows after this elapsed time
	AllowedLateness time.Duration // how long after a window closes it may still be revised
	MaxFutureSkew   time.Duration // readings stamped further ahead of the synchronized clock are refused
	// TimeFloor: readings stamped before it cannot be real; zero means
	// no floor. See UntrustedDeviceTime.
	TimeFloor time.Time
	// UntrustedDeviceTime is what becomes of a reading its device
	// stamped before TimeFloor.
	UntrustedDeviceTime UntrustedPolicy
	// MaxDeviceSkew: a device whose clock differs from the gateway's
	// synchronized clock by more than this throughout DeviceSkewPeriod is
	// reported as skewed (DeviceStat); 0 reports none. DeviceSkewPeriod is
	// how long the difference must last, and how often it is measured.
	MaxDeviceSkew    time.Duration
	DeviceSkewPeriod time.Duration
	// MaxRetained caps the number of closed windows (over all series) kept
	// in memory so that late readings can revise them. Without a Store,
	// when the cap is reached the window closed longest ago is evicted
	// first, and later readings for it (or any older window of its series)
	// end as Evicted; with a Store it is the size of the RAM cache in front
	// of the store. Each window in memory costs about 150 bytes.
	MaxRetained int
	// MaxDevices, MaxSeries and MaxMetricsPerDevice bound what one device
	// (or many) can make the aggregator hold: a reading that would create a
	// series beyond them ends as TooManySeries. A series lives while it has
	// an open window (or, without a Store, a retained one): one whose
	// windows have closed is dropped from RAM, so the limits count series
	// in use, not every name ever seen. 0 means no limit.
	MaxDevices          int
	MaxSeries           int
	MaxMetricsPerDevice int
}

// DefaultConfig returns the defaults of SPEC.md.
func DefaultConfig() Config {
	return Config{
		Window:          time.Minute,
		MaxOutOfOrder:   5 * time.Second,
		IdleClose:       90 * time.Second,
		AllowedLateness: 24 * time.Hour,
		MaxFutureSkew:   2 * time.Minute,
		TimeFloor:       DefaultTimeFloor(),
		// Within a minute: a device that keeps time by NTP is off by
		// milliseconds, one without by minutes a month or by years.
		MaxDeviceSkew:    time.Minute,
		DeviceSkewPeriod: 5 * time.Minute,
		MaxRetained:      100_000,
		// About 250 bytes per live series and a window in RAM: 100,000
		// series are under 32 MiB, and far more than a gateway's devices
		// measure. 256 metrics is many times what a multi-sensor node
		// reports.
		MaxDevices:          10_000,
		MaxSeries:           100_000,
		MaxMetricsPerDevice: 256,
	}
}

// Validate reports the first rule the configuration breaks.
func (c Config) Validate() error {
	switch {
	case c.Window < time.Second:
		return errors.New("window must be at least 1s")
	case c.Window > 24*time.Hour:
		return errors.New("window must be at most 24h")
	case c.MaxOutOfOrder < 0:
		return errors.New("max_out_of_order must not be negative")
	case c.IdleClose <= 0:
		return errors.New("idle_close must be positive")
	case c.AllowedLateness < 0:
		return errors.New("allowed_lateness must not be negative")
	case c.MaxFutureSkew < 0:
		return errors.New("max_future_skew must not be negative")
	case c.UntrustedDeviceTime > UntrustedDeadLetter:
		return errors.New("untrusted_device_time must be arrival or deadletter")
	case c.MaxDeviceSkew < 0:
		return errors.New("max_device_skew must not be negative")
	case c.MaxDeviceSkew > 0 && c.DeviceSkewPeriod <= 0:
		return errors.New("device skew period must be positive")
	case c.MaxRetained < 0:
		return errors.New("max_retained must not be negative")
	case c.MaxDevices < 0:
		return errors.New("max_devices must not be negative")
	case c.MaxSeries < 0:
		return errors.New("max_series must not be negative")
	case c.MaxMetricsPerDevice < 0:
		return errors.New("max_metrics_per_device must not be negative")
	}
	return nil
}

// Counts holds how many readings ended in each outcome, and how many
// summaries were emitted.
type Counts struct {
	Readings  [numOutcomes]uint64
	Summaries uint64 // emitted, revisions included
	Evictions uint64 // retained windows evicted to respect MaxRetained
}

// Of returns the number of readings that ended in o.
func (c *Counts) Of(o Outcome) uint64 { return c.Readings[o] }

// Total returns the number of readings seen.
func (c *Counts) Total() uint64 {
	var n uint64
	for _, v := range c.Readings {
		n += v
	}
	return n
}

type seriesKey struct{ device, metric string }

// retainedKey names a retained window by its series' names, not the
// series: a series without open windows is dropped, and a later reading
// that makes it again must find its retained windows.
type retainedKey struct {
	dev, metric string
	start       int64
}

type device struct {
	id         string
	maxEvent   int64 // latest accepted event time, Unix ns; watermark is this - MaxOutOfOrder
	hasEvent   bool
	lastSeen   int64     // elapsed time (Clock.Elapsed) of the last reading: idle closing
	lastSeenAt int64     // wall clock of the last reading, Unix ns: for status
	series     []*series // sorted by metric
	open       int       // open windows over all series
	minEnd     int64     // smallest end among open windows, valid when open > 0
	// closedTo is the latest end of a window it closed: windows starting
	// before it may have been closed ahead of the watermark (idle close,
	// flush), and a reading for one revises it.
	closedTo int64
	// outcomes counts the device's readings by outcome since the process
	// started (statistics: not in snapshots). Future and Invalid readings
	// are refused before the device is looked up and are not counted here;
	// DeviceClockUnset ones are, once the device is known.
	outcomes [numOutcomes]uint64
	replaced uint64 // readings stamped on arrival for a clock before TimeFloor (statistics)
	skew     skew
}

// skew measures a device's clock against the gateway's synchronized one
// over periods of DeviceSkewPeriod (statistics: not in snapshots). The
// offset of a reading is its time minus its arrival; delays in transit
// only lower it, so the highest offset of a period is the best estimate
// of the device clock's.
type skew struct {
	from     int64 // arrival of the current period's first reading, Unix ns
	n        int   // readings in the current period
	lo, hi   int64 // lowest and highest offset in the current period
	offset   int64 // the estimate of the latest full period
	measured bool  // a full period was measured
	skewed   bool  // every offset of the latest full period was beyond MaxDeviceSkew, on one side
}

type series struct {
	dev      *device
	metric   string
	open     []*window // sorted by start; usually one or two
	evicted  bool
	evictEnd int64 // windows starting before this may have lost their state
	retained int   // without a Store: its windows in Aggregator.retained
}

// Aggregator holds the open windows and the retained closed windows of every
// series. Create it with New.
type Aggregator struct {
	cfg    Config
	window int64
	floor  int64 // cfg.TimeFloor in Unix ns; math.MinInt64 without one
	clk    Clock
	emit   func(Summary)

	series   map[seriesKey]*series
	devices  map[string]*device
	devList  []*device // in order of first reading: Tick and Flush go through devices in this order, so emissions are deterministic
	retained map[retainedKey]*window
	order    []retainedKey // closing order, oldest first, from orderHead
	head     int
	free     []*window
	counts   Counts
	// The most entries series and retained held since they were last
	// rebuilt: Go maps do not shrink, so Tick rebuilds one that has
	// emptied, and a burst of series costs nothing once it has closed.
	seriesPeak, retainedPeak int
	added                    bool    // a reading arrived since the last Tick
	last                     *device // the device of the latest lookup
	store                    Store   // closed windows beyond the RAM cache; nil keeps them all in RAM
	// forgotten are the devices Forget dropped since Horizons last
	// reported them.
	forgotten map[string]bool
}

// New returns an Aggregator. clk is the clock used for future-skew checks,
// stamping on arrival and idle closing; emit receives every summary (first
// emissions and revisions) synchronously, in window order per series.
func New(cfg Config, clk Clock, emit func(Summary)) (*Aggregator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	floor := int64(math.MinInt64)
	if !cfg.TimeFloor.IsZero() {
		floor = cfg.TimeFloor.UnixNano()
	}
	return &Aggregator{
		cfg:      cfg,
		window:   int64(cfg.Window),
		floor:    floor,
		clk:      clk,
		emit:     emit,
		series:   make(map[seriesKey]*series),
		devices:  make(map[string]*device),
		retained: make(map[retainedKey]*window),
	}, nil
}

// Counts returns a snapshot of the outcome counters.
func (a *Aggregator) Counts() Counts { return a.counts }

// OpenWindows returns the number of windows currently open.
func (a *Aggregator) OpenWindows() int {
	n := 0
	for _, d := range a.devices {
		n += d.open
	}
	return n
}

// Series returns the number of series held in RAM: those with an open
// window (or, without a Store, a retained one).
func (a *Aggregator) Series() int { return len(a.series) }

// Devices returns the number of devices seen.
func (a *Aggregator) Devices() int { return len(a.devices) }

// Has reports whether device's series of metric is held in RAM (a
// reading for it makes no series), whether device is known (one for it
// makes no device), and how many series the device holds: what the
// limits of Add (MaxSeries, MaxDevices, MaxMetricsPerDevice) count, for a
// caller that holds readings back and would apply them as Add will.
func (a *Aggregator) Has(device, metric string) (series, known bool, metrics int) {
	_, series = a.series[seriesKey{device, metric}]
	d, known := a.devices[device]
	if known {
		metrics = len(d.series)
	}
	return series, known, metrics
}

// Limits returns MaxSeries, MaxDevices and MaxMetricsPerDevice (0: no
// limit).
func (a *Aggregator) Limits() (series, devices, metricsPerDevice int) {
	return a.cfg.MaxSeries, a.cfg.MaxDevices, a.cfg.MaxMetricsPerDevice
}

// windowStart returns the start of the epoch-aligned window holding t.
func (a *Aggregator) windowStart(t int64) int64 {
	s := t - t%a.window
	if t%a.window < 0 { // before 1970: round towards -inf
		s -= a.window
	}
	return s
}

// Add folds one reading into its window and returns its outcome. Summaries
// that the reading completes or revises are passed to emit before Add
// returns.
func (a *Aggregator) Add(r Reading) Outcome {
	a.added = true
	o := a.add(r)
	a.counts.Readings[o]++
	if d := a.last; d != nil && d.id == r.Device {
		d.outcomes[o]++
	}
	return o
}

// DeviceStat is one device's state, for status pages and metrics.
type DeviceStat struct {
	ID          string
	LastSeen    time.Time // gateway clock at its latest reading
	Watermark   time.Time // its event-time watermark (zero before any reading)
	OpenWindows int
	Aggregated  uint64 // readings into open windows since start
	Revised     uint64 // late readings that revised a closed window
	TooLate     uint64 // readings beyond the allowed lateness
	// ClockUnset counts its readings stamped before TimeFloor since start:
	// those stamped on arrival instead and those refused.
	ClockUnset uint64
	// ClockOffset is how far its clock is ahead of the gateway's
	// synchronized clock (negative: behind), measured over the latest
	// DeviceSkewPeriod; valid when ClockMeasured. ClockSkewed: it was off by
	// more than MaxDeviceSkew throughout that period.
	ClockOffset   time.Duration
	ClockMeasured bool
	ClockSkewed   bool
}

// DeviceStats calls fn for each device in order of first reading, until fn
// returns false.
func (a *Aggregator) DeviceStats(fn func(DeviceStat) bool) {
	for _, d := range a.devList {
		st := DeviceStat{ID: d.id, LastSeen: time.Unix(0, d.lastSeenAt).UTC(), OpenWindows: d.open,
			Aggregated: d.outcomes[Aggregated], Revised: d.outcomes[Revised], TooLate: d.outcomes[TooLate],
			ClockUnset:  d.replaced + d.outcomes[DeviceClockUnset],
			ClockOffset: time.Duration(d.skew.offset), ClockMeasured: d.skew.measured, ClockSkewed: d.skew.skewed}
		if d.hasEvent {
			st.Watermark = time.Unix(0, d.watermark(a.cfg.MaxOutOfOrder)).UTC()
		}
		if !fn(st) {
			return
		}
	}
}

// SkewedDevices returns the number of devices whose clock was found
// skewed (DeviceStat.ClockSkewed).
func (a *Aggregator) SkewedDevices() int {
	n := 0
	for _, d := range a.devList {
		if d.skew.skewed {
			n++
		}
	}
	return n
}

// measureSkew accounts for a reading whose device stamped it off ahead of
// its arrival at (the synchronized clock).
func (a *Aggregator) measureSkew(d *device, off, at int64) {
	if a.cfg.MaxDeviceSkew == 0 {
		return
	}
	k := &d.skew
	if k.n == 0 || at < k.from {
		k.from, k.n, k.lo, k.hi = at, 0, off, off
	}
	k.n++
	k.lo, k.hi = min(k.lo, off), max(k.hi, off)
	if at-k.from < int64(a.cfg.DeviceSkewPeriod) {
		return
	}
	bound := int64(a.cfg.MaxDeviceSkew)
	k.offset, k.measured = k.hi, true
	k.skewed = k.lo > bound || k.hi < -bound
	k.n = 0
}

func (a *Aggregator) add(r Reading) Outcome {
	if r.Device == "" || r.Metric == "" || math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Timing >= numTimings {
		return Invalid
	}
	wall, synced := a.clk.Now()
	now := wall.UnixNano()
	t, timing := r.Time.UnixNano(), r.Timing
	replaced := false
	if t < a.floor {
		if timing != DeviceTime {
			return GatewayClockUnset
		}
		if a.cfg.UntrustedDeviceTime != UntrustedArrival || !synced {
			a.last = a.devices[r.Device]
			return DeviceClockUnset
		}
		if now < a.floor {
			return GatewayClockUnset
		}
		t, timing, replaced = now, ReplacedTime, true
	}
	if synced && t > now+int64(a.cfg.MaxFutureSkew) {
		return Future
	}
	s := a.lookup(r)
	if s == nil {
		return TooManySeries
	}
	defer a.dropIfIdle(s)
	d := s.dev
	d.lastSeen, d.lastSeenAt = int64(a.clk.Elapsed()), now
	if replaced {
		d.replaced++
	} else if timing == DeviceTime && synced {
		a.measureSkew(d, t-now, now)
	}
	start := a.windowStart(t)
	end := start + a.window

	if w := s.findOpen(start); w != nil {
		w.put(t, r.Value, r.Unit, timing)
		a.advance(d, t)
		return Aggregated
	}
	wm := d.watermark(a.cfg.MaxOutOfOrder)
	w, ok := a.retained[retainedKey{d.id, s.metric, start}]
	if !ok && a.store != nil && d.hasEvent && (end <= wm || start < d.closedTo) && end+int64(a.cfg.AllowedLateness) > wm {
		// Closed (behind the watermark, or ahead of it by an idle close or
		// the shutdown's flush) and still revisable: it may be in the
		// store.
		st, found, err := a.store.Load(d.id, s.metric, start)
		if err != nil {
			return Evicted // its state cannot be read: a revision 0 would contradict what was sent
		}
		if found {
			w, ok = a.windowFrom(st), true
			a.cache(s, w)
		}
	}
	if ok {
		if d.hasEvent && end+int64(a.cfg.AllowedLateness) <= wm {
			return TooLate
		}
		w.put(t, r.Value, r.Unit, timing)
		w.late++
		w.dirty = true
		a.emitWindow(s, w)
		return Revised
	}
	behind := d.hasEvent && end <= wm
	if behind && end+int64(a.cfg.AllowedLateness) <= wm {
		return TooLate
	}
	if s.evicted && start < s.evictEnd {
		return Evicted
	}
	w = a.newWindow(start)
	w.put(t, r.Value, r.Unit, timing)
	if behind {
		// A late reading that is the first of its window: emitted at once,
		// then retained for further revisions.
		w.late++
		a.emitWindow(s, w)
		a.retain(s, w)
		return Revised
	}
	s.insertOpen(w)
	d.open++
	if d.open == 1 || end < d.minEnd {
		d.minEnd = end
	}
	a.advance(d, t)
	return Aggregated
}

func (d *device) watermark(ooo time.Duration) int64 { return d.maxEvent - int64(ooo) }

// lookup finds or creates the series of r, or returns nil when creating
// it would exceed MaxDevices, MaxSeries or MaxMetricsPerDevice. Names are
// copied on creation so the aggregator never pins the caller's buffers.
func (a *Aggregator) lookup(r Reading) *series {
	if s, ok := a.series[seriesKey{r.Device, r.Metric}]; ok {
		a.last = s.dev
		return s
	}
	if a.cfg.MaxSeries > 0 && len(a.series) >= a.cfg.MaxSeries {
		a.last = a.devices[r.Device]
		return nil
	}
	d, ok := a.devices[r.Device]
	if !ok {
		if a.cfg.MaxDevices > 0 && len(a.devices) >= a.cfg.MaxDevices {
			return nil
		}
		d = &device{id: cloneString(r.Device)}
		delete(a.forgotten, d.id)
		a.devices[d.id] = d
		a.devList = append(a.devList, d)
	}
	a.last = d
	if a.cfg.MaxMetricsPerDevice > 0 && len(d.series) >= a.cfg.MaxMetricsPerDevice {
		return nil
	}
	s := &series{dev: d, metric: cloneString(r.Metric)}
	a.seriesPeak = max(a.seriesPeak, len(a.series)+1)
	// Sorted by metric: windows closing together are emitted in this
	// order, which then does not depend on when a series was dropped and
	// made again.
	i, _ := slices.BinarySearchFunc(d.series, s.metric, func(x *series, m string) int { return strings.Compare(x.metric, m) })
	d.series = slices.Insert(d.series, i, s)
	a.series[seriesKey{d.id, s.metric}] = s
	return s
}

// idle reports whether a series holds nothing: no open window, no
// retained window without a Store (with one, they are found by name), and
// no eviction still within the allowed lateness. Such a series is dropped;
// a later reading makes it again. The decision depends only on the state a
// snapshot keeps, so a replay drops the same series at the same moments
// and emits in the same order.
func (a *Aggregator) idle(s *series) bool {
	d := s.dev
	if len(s.open) > 0 || a.store == nil && s.retained > 0 {
		return false
	}
	return !s.evicted || d.hasEvent && s.evictEnd+int64(a.cfg.AllowedLateness) <= d.watermark(a.cfg.MaxOutOfOrder)
}

// dropIfIdle drops s if it is idle.
func (a *Aggregator) dropIfIdle(s *series) {
	k := seriesKey{s.dev.id, s.metric}
	if !a.idle(s) || a.series[k] != s {
		return
	}
	delete(a.series, k)
	if i := slices.Index(s.dev.series, s); i >= 0 {
		s.dev.series = slices.Delete(s.dev.series, i, i+1)
	}
}

func cloneString(s string) string {
	if s == "" {
		return ""
	}
	return string(append([]byte(nil), s...))
}

// advance moves the device's watermark to account for event time t and closes
// every window that ends at or before it.
func (a *Aggregator) advance(d *device, t int64) {
	if d.hasEvent && t <= d.maxEvent {
		return
	}
	d.maxEvent, d.hasEvent = t, true
	wm := d.watermark(a.cfg.MaxOutOfOrder)
	if d.open == 0 || wm < d.minEnd {
		return
	}
	a.closeDevice(d, wm)
}

// closeDevice closes the device's open windows that end at or before limit
// (all of them when limit is math.MaxInt64).
func (a *Aggregator) closeDevice(d *device, limit int64) {
	d.minEnd = math.MaxInt64
	idle := 0
	for _, s := range d.series {
		n := 0
		for n < len(s.open) && s.open[n].start+a.window <= limit {
			w := s.open[n]
			d.closedTo = max(d.closedTo, w.start+a.window)
			a.emitWindow(s, w)
			a.retain(s, w)
			n++
		}
		if n > 0 {
			d.open -= n
			rest := copy(s.open, s.open[n:])
			clear(s.open[rest:])
			s.open = s.open[:rest]
		}
		if len(s.open) > 0 && s.open[0].start+a.window < d.minEnd {
			d.minEnd = s.open[0].start + a.window
		}
		if len(s.open) == 0 {
			idle++
		}
	}
	if idle > 0 {
		d.series = slices.DeleteFunc(d.series, func(s *series) bool {
			if !a.idle(s) {
				return false
			}
			delete(a.series, seriesKey{d.id, s.metric})
			return true
		})
	}
}

// Forget drops a device, for a caller that knows it is gone (a Sparkplug
// edge node dead for its horizon): its open windows are closed and
// emitted as an idle close would, and its series and watermark are
// dropped, so that what it held no longer counts against MaxDevices and
// the snapshot. Closed windows kept for revisions stay where they are and
// expire as before. A later reading makes the device again, with a new
// watermark: a late reading for a window closed before is a revision when
// the window's state is found (in the cache or the Store, once the new
// watermark has passed the window), and otherwise opens the window
// afresh. It reports whether the device was held.
func (a *Aggregator) Forget(device string) bool {
	d := a.devices[device]
	if d == nil {
		return false
	}
	if d.open > 0 {
		a.closeDevice(d, math.MaxInt64)
	}
	for _, s := range d.series {
		delete(a.series, seriesKey{d.id, s.metric})
	}
	delete(a.devices, device)
	if a.forgotten == nil {
		a.forgotten = map[string]bool{}
	}
	a.forgotten[d.id] = true
	if i := slices.Index(a.devList, d); i >= 0 {
		a.devList = slices.Delete(a.devList, i, i+1)
	}
	if a.last == d {
		a.last = nil
	}
	return true
}

// Tick closes the windows of devices that have been silent for IdleClose
// (of Clock.Elapsed) and drops retained windows that can no longer be
// revised. Call it about once a second.
func (a *Aggregator) Tick() {
	a.added = false
	now := int64(a.clk.Elapsed())
	idle := int64(a.cfg.IdleClose)
	for _, d := range a.devList {
		if d.open > 0 && now-d.lastSeen >= idle {
			a.closeDevice(d, math.MaxInt64)
		}
	}
	a.expire()
	a.shrink()
}

// shrink rebuilds the maps and the device series lists that hold less
// than a quarter of what they once did.
func (a *Aggregator) shrink() {
	const least = 1024
	if a.seriesPeak > least && len(a.series) < a.seriesPeak/4 {
		a.series = rebuild(a.series)
		a.seriesPeak = len(a.series)
		for _, d := range a.devList {
			if cap(d.series) > 16 && len(d.series) < cap(d.series)/4 {
				d.series = slices.Clone(d.series)
			}
		}
	}
	if a.retainedPeak > least && len(a.retained) < a.retainedPeak/4 {
		a.retained = rebuild(a.retained)
		a.retainedPeak = len(a.retained)
	}
	if live := len(a.order) - a.head; cap(a.order) > least && live < cap(a.order)/4 {
		a.order, a.head = slices.Clone(a.order[a.head:]), 0
	}
}

func rebuild[K comparable, V any](m map[K]V) map[K]V {
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

// TickDue reports whether Tick at elapsed time elapsed (Clock.Elapsed, as
// it will read then) could change anything: some device's open windows
// have been idle for IdleClose, or readings arrived since the last Tick (so
// retained windows may have expired). A caller that makes ticks durable can
// skip the others and stay quiet while nothing happens.
func (a *Aggregator) TickDue(elapsed time.Duration) bool {
	if a.added {
		return true
	}
	n, idle := int64(elapsed), int64(a.cfg.IdleClose)
	for _, d := range a.devList {
		if d.open > 0 && n-d.lastSeen >= idle {
			return true
		}
	}
	return false
}

// Flush closes every open window, as at shutdown.
func (a *Aggregator) Flush() {
	for _, d := range a.devList {
		if d.open > 0 {
			a.closeDevice(d, math.MaxInt64)
		}
	}
}

// retain keeps a closed window so that late readings can revise it.
func (a *Aggregator) retain(s *series, w *window) {
	if a.cfg.AllowedLateness == 0 || a.cfg.MaxRetained == 0 {
		a.markEvicted(s, w.start)
		a.release(w)
		return
	}
	w.dirty = true
	if a.store != nil {
		a.cache(s, w)
		return
	}
	k := retainedKey{s.dev.id, s.metric, w.start}
	a.retained[k] = w
	a.retainedPeak = max(a.retainedPeak, len(a.retained))
	s.retained++
	a.order = append(a.order, k)
	for len(a.retained) > a.cfg.MaxRetained {
		a.popOldest(true)
	}
}

// cache keeps a closed window in RAM in front of the store.
func (a *Aggregator) cache(s *series, w *window) {
	k := retainedKey{s.dev.id, s.metric, w.start}
	a.retained[k] = w
	a.retainedPeak = max(a.retainedPeak, len(a.retained))
	a.order = append(a.order, k)
	a.trimCache()
}

func (a *Aggregator) markEvicted(s *series, start int64) {
	if !s.evicted || start+a.window > s.evictEnd {
		s.evicted, s.evictEnd = true, start+a.window
	}
}

// popOldest removes the retained window closed longest ago. evict says the
// removal is for space (counted, and later readings are refused as Evicted)
// rather than expiry.
func (a *Aggregator) popOldest(evict bool) {
	k := a.order[a.head]
	a.order[a.head] = retainedKey{}
	a.head++
	if w, ok := a.retained[k]; ok {
		delete(a.retained, k)
		if s := a.series[seriesKey{k.dev, k.metric}]; s != nil && a.store == nil {
			// Without a Store a series with retained windows is kept.
			s.retained--
			if evict {
				a.markEvicted(s, k.start)
			}
			defer a.dropIfIdle(s)
		}
		if evict {
			a.counts.Evictions++
		}
		a.release(w)
	}
	if a.head > 1024 && a.head*2 > len(a.order) {
		n := copy(a.order, a.order[a.head:])
		clear(a.order[n:])
		a.order, a.head = a.order[:n], 0
	}
}

// expire drops retained windows, oldest first, whose lateness bound has
// passed their device's watermark. It stops at the first one still live, so a
// long-silent device can hold back expiry of others until MaxRetained evicts.
func (a *Aggregator) expire() {
	late := int64(a.cfg.AllowedLateness)
	for a.head < len(a.order) {
		k := a.order[a.head]
		if _, ok := a.retained[k]; ok {
			// A forgotten device's (Forget) expire whenever they are met.
			if d := a.devices[k.dev]; d != nil && k.start+a.window+late > d.watermark(a.cfg.MaxOutOfOrder) {
				return
			}
		}
		a.popOldest(false)
	}
}

// Retained returns the number of closed windows kept for late revisions.
func (a *Aggregator) Retained() int { return len(a.retained) }

func (a *Aggregator) newWindow(start int64) *window {
	var w *window
	if n := len(a.free); n > 0 {
		w = a.free[n-1]
		a.free = a.free[:n-1]
		*w = window{}
	} else {
		w = new(window)
	}
	w.start = start
	return w
}

func (a *Aggregator) release(w *window) {
	if len(a.free) < 4096 {
		a.free = append(a.free, w)
	}
}

func (a *Aggregator) emitWindow(s *series, w *window) {
	sum := Summary{
		Gateway:     a.cfg.Gateway,
		Device:      s.dev.id,
		Metric:      s.metric,
		Unit:        w.unit,
		WindowStart: time.Unix(0, w.start).UTC(),
		WindowEnd:   time.Unix(0, w.start+a.window).UTC(),
		Count:       w.count,
		Min:         w.min,
		Max:         w.max,
		Sum:         w.sum,
		Mean:        w.mean,
		First:       w.first,
		Last:        w.last,
		Stddev:      math.Sqrt(w.m2 / float64(w.count)),
		Revision:    w.revision,
		Late:        w.late,

		TimeSource:     w.timeSource(),
		TimeReplaced:   w.replaced,
		TimeRebased:    w.rebased,
		TimeUnverified: w.unverified,
	}
	sum.ID = SummaryID(sum.Gateway, sum.Device, sum.Metric, sum.WindowStart, sum.Revision)
	w.revision++
	a.counts.Summaries++
	if a.emit != nil {
		a.emit(sum)
	}
}

func (s *series) findOpen(start int64) *window {
	for _, w := range s.open {
		if w.start == start {
			return w
		}
	}
	return nil
}

func (s *series) insertOpen(w *window) {
	i := len(s.open)
	for i > 0 && s.open[i-1].start > w.start {
		i--
	}
	s.open = append(s.open, nil)
	copy(s.open[i+1:], s.open[i:])
	s.open[i] = w
}

// window accumulates the statistics of one series in one window. Mean and
// variance use Welford's update, which stays accurate for long windows of
// nearly equal values where a sum of squares would cancel.
type window struct {
	start    int64
	count    int64
	min, max float64
	sum      float64
	mean, m2 float64
	firstT   int64
	lastT    int64
	first    float64
	last     float64
	late     int64
	revision int
	unit     string
	dirty    bool // retained, and changed since the last TakeDirty
	// Readings by Timing: devTimed with DeviceTime, and of the others
	// (stamped by the gateway), replaced, rebased and unverified ones.
	devTimed, replaced, rebased, unverified int64
}

// put adds a reading with its unit and the origin of its time.
func (w *window) put(t int64, v float64, unit string, timing Timing) {
	w.add(t, v)
	w.setUnit(unit)
	switch timing {
	case DeviceTime:
		w.devTimed++
	case ReplacedTime:
		w.replaced++
	case RebasedTime:
		w.rebased++
	case UnverifiedTime:
		w.unverified++
	}
}

// Time sources of a summary (Summary.TimeSource).
const (
	SourceDevice  = "device"  // every reading's time came from its device
	SourceGateway = "gateway" // every reading was stamped by the gateway
	SourceMixed   = "mixed"   // some of each
)

func (w *window) timeSource() string {
	switch w.devTimed {
	case w.count:
		return SourceDevice
	case 0:
		return SourceGateway
	}
	return SourceMixed
}

// setUnit records the unit of a reading in the window: the last one given
// wins, and readings without a unit keep the window's.
func (w *window) setUnit(u string) {
	if u != "" && u != w.unit {
		w.unit = cloneString(u)
	}
}

func (w *window) add(t int64, v float64) {
	w.count++
	if w.count == 1 {
		w.min, w.max = v, v
		w.firstT, w.first = t, v
		w.lastT, w.last = t, v
	} else {
		w.min = math.Min(w.min, v)
		w.max = math.Max(w.max, v)
		if t < w.firstT { // ties keep the earlier arrival
			w.firstT, w.first = t, v
		}
		if t >= w.lastT { // ties take the later arrival
			w.lastT, w.last = t, v
		}
	}
	w.sum += v
	delta := v - w.mean
	w.mean += delta / float64(w.count)
	w.m2 += delta * (v - w.mean)
}
