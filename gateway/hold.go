package gateway

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/gateway/journal"
)

// The hold. A reading the gateway stamps itself (a payload without a
// time, the gateway's own sensors) while its clock is not synchronized
// would get a time that may be anything: 1970, or the time a Raspberry Pi
// last saved before it was switched off days ago. Such readings are not
// aggregated then: each publication's are written to the hold log
// (<data_dir>/hold, a queue.Log) with the event's wall and monotonic times
// and boot. When the clock is synchronized (a clock event says so), every
// held reading of the same boot is re-based to true time, by the
// monotonic clock that elapsed since it arrived, and aggregated
// (aggregate.RebasedTime). If the clock is not synchronized within
// Options.HoldMaxAge, or the held readings pass Options.HoldMaxBytes, or
// they are of an earlier boot, they are aggregated at the time the
// gateway gave them, marked unverified (aggregate.UnverifiedTime).
//
// One device cannot fill the hold for everyone (which would release
// every device's readings unverified): a reading is held only if the
// aggregator's series limits would let it in (max_series,
// max_metrics_per_device, max_devices, counting the series and devices
// held as if they were made already), else it is refused as
// too_many_series, as it would be when released; and a device holds at
// most HoldMaxBytes / holdDeviceShare, beyond which its own readings are
// aggregated at once at the gateway's time, unverified, as if the hold
// were off for it (holdShare).
//
// The hold is part of the state (journal.Hold, checkpointed): what is
// held and released depends only on the journal, so a replay does the
// same. What each device holds is not in the checkpoint: it is rebuilt
// from the hold log at start. The hold log is synced by each checkpoint and its released
// segments are removed after it. A record carries the journal sequence of
// its publication: at start, the last durable one says which a replay
// must not write again.

// heldReading is a reading waiting in the hold: its time is the arrival
// plus delta (a SenML relative time, a sensor's poll before it was
// journaled).
type heldReading struct {
	device, metric, unit string
	value                float64
	delta                int64
}

// heldRecord is one publication's held readings, as the hold log keeps it:
//
//	uvarint journal seq, string boot, varint wall, uvarint monotonic,
//	varint gateway time (the event's), string client, string topic,
//	uvarint n, n × (string device, string metric, string unit,
//	float64 LE value, varint delta)
type heldRecord struct {
	seq              uint64
	boot             string
	wall, mono, gate int64
	client, topic    string
	readings         []heldReading
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (r *heldRecord) append(b []byte) []byte {
	b = binary.AppendUvarint(b, r.seq)
	b = appendStr(b, r.boot)
	b = binary.AppendVarint(b, r.wall)
	b = binary.AppendUvarint(b, uint64(max(0, r.mono)))
	b = binary.AppendVarint(b, r.gate)
	b = appendStr(b, r.client)
	b = appendStr(b, r.topic)
	b = binary.AppendUvarint(b, uint64(len(r.readings)))
	for _, h := range r.readings {
		b = appendStr(b, h.device)
		b = appendStr(b, h.metric)
		b = appendStr(b, h.unit)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(h.value))
		b = binary.AppendVarint(b, h.delta)
	}
	return b
}

var errHeld = errors.New("undecodable hold record")

func decodeHeld(b []byte) (heldRecord, error) {
	var r heldRecord
	ok := true
	uv := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			ok = false
			return 0
		}
		b = b[n:]
		return v
	}
	sv := func() int64 {
		v, n := binary.Varint(b)
		if n <= 0 {
			ok = false
			return 0
		}
		b = b[n:]
		return v
	}
	str := func() string {
		n := uv()
		if !ok || n > uint64(len(b)) {
			ok = false
			return ""
		}
		s := string(b[:n])
		b = b[n:]
		return s
	}
	r.seq, r.boot = uv(), str()
	r.wall, r.mono, r.gate = sv(), int64(uv()), sv()
	r.client, r.topic = str(), str()
	n := uv()
	if n > uint64(len(b)) {
		return r, errHeld
	}
	for range n {
		h := heldReading{device: str(), metric: str(), unit: str()}
		if len(b) < 8 {
			return r, errHeld
		}
		h.value = math.Float64frombits(binary.LittleEndian.Uint64(b))
		b = b[8:]
		h.delta = sv()
		r.readings = append(r.readings, h)
	}
	if !ok || len(b) != 0 {
		return r, errHeld
	}
	return r, nil
}

// holdDeviceShare divides clock.hold_max_bytes into what one device may
// hold: an eighth, so that it takes eight devices at their share to fill
// the hold (and release everyone's readings unverified), while a device
// sending many readings still holds thousands of them (8 MiB of the
// default 64 MiB: some 300,000 readings in SenML packs, 100,000 in
// publications of one).
const holdDeviceShare = 8

// holdShare is what the hold holds per device, for the limits above:
// its distinct series and bytes. It is a function of the hold log's
// records not released, and the aggregator's state, both of which a
// replay rebuilds; Refused and OverShare count since start.
type holdShare struct {
	devices map[string]*heldDevice
	series  int // distinct series held
	// refused counts readings refused as they were held (too_many_series);
	// overShare those of a device over its share, aggregated unverified.
	refused, overShare uint64
	memo               roomMemo
}

type heldDevice struct {
	metrics map[string]struct{}
	bytes   int64 // its readings' bytes in the hold log, and the records they begin
}

func (s *holdShare) reset() {
	clear(s.devices)
	s.series = 0
	s.memo = roomMemo{metrics: -1, series: -1, devices: -1}
}

// device returns what the hold holds of device, made if need be.
func (s *holdShare) device(device string) *heldDevice {
	if s.devices == nil {
		s.devices = map[string]*heldDevice{}
	}
	d := s.devices[device]
	if d == nil {
		d = &heldDevice{metrics: map[string]struct{}{}}
		s.devices[device] = d
	}
	return d
}

// add counts one held reading.
func (s *holdShare) add(h heldReading) {
	d := s.device(h.device)
	if _, ok := d.metrics[h.metric]; !ok {
		d.metrics[h.metric] = struct{}{}
		s.series++
	}
	d.bytes += h.size()
}

// addRecord counts what a record of size bytes adds to the bytes of its
// readings (its journal seq, times, client and topic), for the device of
// its first reading.
func (s *holdShare) addRecord(rec *heldRecord, size int) {
	if len(rec.readings) == 0 {
		return
	}
	n := int64(size)
	for _, h := range rec.readings {
		n -= h.size()
	}
	s.device(rec.readings[0].device).bytes += n
}

// size is what a reading takes in its hold log record.
func (h heldReading) size() int64 {
	var b [binary.MaxVarintLen64]byte
	str := func(s string) int { return binary.PutUvarint(b[:], uint64(len(s))) + len(s) }
	return int64(str(h.device) + str(h.metric) + str(h.unit) + 8 + binary.PutVarint(b[:], h.delta))
}

// holdVerdict is what becomes of a reading the gateway would hold.
type holdVerdict int

const (
	holdIt        holdVerdict = iota
	holdRefused               // over the series limits: too_many_series
	holdOverShare             // its device holds its share: aggregate it now, unverified
)

// admitHeld decides whether reading h may be held (and if so counts it),
// with g.mu held.
func (g *Gateway) admitHeld(h heldReading) holdVerdict {
	s := &g.ing.share
	d := s.devices[h.device]
	var heldMetric bool
	if d != nil {
		_, heldMetric = d.metrics[h.metric]
	}
	if !heldMetric {
		if live, known, metrics := g.agg.Has(h.device, h.metric); !live && !g.seriesRoom(h.device, known, metrics, d) {
			s.refused++
			return holdRefused
		}
	}
	if d != nil && d.bytes+h.size() > g.opts.HoldMaxBytes/holdDeviceShare {
		s.overShare++
		return holdOverShare
	}
	s.add(h)
	return holdIt
}

// seriesRoom reports whether a new series of device (known to the
// aggregator or not, with metrics series there, d what the hold holds of
// it) is within the aggregator's limits, counting the series and devices
// the hold holds as made. First on the upper bound (a series or device
// both held and in the aggregator counted twice: after a restart, the
// open windows of series whose readings are now held); only when that is
// at a limit, exactly.
func (g *Gateway) seriesRoom(device string, known bool, metrics int, d *heldDevice) bool {
	s := &g.ing.share
	maxSeries, maxDevices, maxMetrics := g.agg.Limits()
	m := s.memoFor(g.cur.Seq, [4]int{g.agg.Series(), g.agg.Devices(), s.series, len(s.devices)})
	notLive := func(dev string, held map[string]struct{}) (n int) {
		for metric := range held {
			if live, _, _ := g.agg.Has(dev, metric); !live {
				n++
			}
		}
		return n
	}
	if maxMetrics > 0 && metrics >= maxMetrics {
		return false
	}
	if maxMetrics > 0 && d != nil && metrics+len(d.metrics) >= maxMetrics {
		if m.device != device || m.metrics < 0 {
			m.device, m.metrics = device, notLive(device, d.metrics)
		}
		if metrics+m.metrics >= maxMetrics {
			return false
		}
	}
	if maxSeries > 0 && g.agg.Series()+s.series >= maxSeries {
		if m.series < 0 {
			m.series = 0
			for dev, hd := range s.devices {
				m.series += notLive(dev, hd.metrics)
			}
		}
		if g.agg.Series()+m.series >= maxSeries {
			return false
		}
	}
	if maxDevices > 0 && !known && d == nil && g.agg.Devices()+len(s.devices) >= maxDevices {
		if m.devices < 0 {
			m.devices = 0
			for dev := range s.devices {
				if _, k, _ := g.agg.Has(dev, ""); !k {
					m.devices++
				}
			}
		}
		if g.agg.Devices()+m.devices >= maxDevices {
			return false
		}
	}
	return true
}

// roomMemo keeps the exact counts seriesRoom made at a limit while what
// they count has not changed, within one publication: one of thousands
// of new series from a device at its limit counts once, not once a
// reading. Kept per publication (by its journal seq) so that a replay,
// which applies whole publications, counts the same.
type roomMemo struct {
	seq uint64
	key [4]int // the aggregator's series and devices, the hold's series and devices
	// Not counted: -1.
	device                   string
	metrics, series, devices int
}

// memoFor returns the memo of publication seq, cleared when it is another
// publication's or key has changed.
func (s *holdShare) memoFor(seq uint64, key [4]int) *roomMemo {
	m := &s.memo
	if m.seq != seq || m.key != key {
		*m = roomMemo{seq: seq, key: key, metrics: -1, series: -1, devices: -1}
	}
	return m
}

// HoldStats describes the hold.
type HoldStats struct {
	Readings     uint64        // held now, waiting for the clock
	Publications uint64        // the publications they came in
	Bytes        int64         // their size on disk
	Age          time.Duration // since the first of them was held
	// Rebased and Unverified count the readings released so far:
	// re-based to true time, or aggregated at the gateway's unverified
	// time.
	Rebased, Unverified uint64
	// Refused counts the readings refused as they were to be held, over
	// the aggregator's series limits (too_many_series); OverShare those
	// of a device holding its share of clock.hold_max_bytes, aggregated
	// at once, unverified (not in Unverified). Since start.
	Refused, OverShare uint64
}

// holding reports whether a reading the gateway stamps now goes to the
// hold rather than the aggregator.
func (g *Gateway) holding() bool { return !g.tl.Synchronized && g.opts.HoldMaxBytes > 0 }

// holdPublication writes the readings of the publication being applied
// that ingest held to the hold log (unless a run before a crash already
// did), with g.mu held.
func (g *Gateway) holdPublication(topic, client string) {
	h := &g.ing
	if len(h.held) == 0 {
		return
	}
	rec := heldRecord{seq: g.cur.Seq, boot: g.tl.Boot, wall: g.tl.Wall, mono: g.tl.Mono, gate: g.tl.clock,
		client: client, topic: topic, readings: h.held}
	g.holdBuf = rec.append(g.holdBuf[:0])
	defer func() { clear(h.held); h.held = h.held[:0] }()
	if rec.seq > g.holdMark {
		if _, err := g.holdLog.Append(g.holdBuf); err != nil {
			// The disk failed: rather than lose them, aggregate them now,
			// unverified.
			g.log.Error("hold log write failed; readings stamped while the clock is not synchronized are aggregated unverified", "err", err)
			g.releaseRecord(rec, rec.gate, aggregate.UnverifiedTime)
			return
		}
	}
	g.ing.share.addRecord(&rec, len(g.holdBuf))
	hs := &g.hold
	if hs.Records == 0 {
		hs.Since = g.tl.Elapsed
	}
	hs.Records++
	hs.Readings += uint64(len(rec.readings))
	hs.Bytes += int64(len(g.holdBuf))
}

// holdDue reports whether the held readings are due for release at
// elapsed time elapsed, the clock still not synchronized.
func (g *Gateway) holdDue(elapsed time.Duration) bool {
	hs := &g.hold
	return hs.Records > 0 && (hs.Bytes >= g.opts.HoldMaxBytes || int64(elapsed)-hs.Since >= int64(g.opts.HoldMaxAge))
}

// checkHold releases the held readings once the event at seq has been
// applied, if the clock is synchronized or a bound has been reached.
func (g *Gateway) checkHold(seq uint64) {
	switch {
	case g.hold.Records == 0:
	case g.tl.Synchronized:
		g.releaseHeld(seq, true)
	case g.holdDue(time.Duration(g.tl.Elapsed)):
		g.releaseHeld(seq, false)
	}
}

// releaseHeld aggregates the held readings of events up to seq: re-based
// to true time when the clock is now synchronized (synced) and they are of
// this boot, else at their unverified gateway time.
func (g *Gateway) releaseHeld(seq uint64, synced bool) {
	if err := g.holdLog.Sync(); err != nil {
		g.log.Error("hold log sync failed; held readings are released from what is on disk", "err", err)
	}
	r := g.holdLog.NewReader(g.hold.Start)
	defer r.Close()
	next := g.hold.Start
	var rebased, unverified uint64
	for {
		hseq, data, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			g.log.Error("hold log unreadable; the readings left in it are lost", "err", err)
			break
		}
		rec, err := decodeHeld(data)
		if err != nil {
			g.badEvents.Add(1)
			next = hseq + 1
			continue
		}
		if rec.seq > seq {
			break // written by a run that got further before a crash: the replay will get there
		}
		next = hseq + 1
		base, timing := rec.gate, aggregate.UnverifiedTime
		if synced && rec.boot == g.tl.Boot && g.tl.HasMono {
			// True time: the synchronized clock now, less the monotonic
			// time since the reading arrived.
			base, timing = g.tl.Wall-(g.tl.Mono-rec.mono), aggregate.RebasedTime
			rebased += uint64(len(rec.readings))
		} else {
			unverified += uint64(len(rec.readings))
		}
		g.releaseRecord(rec, base, timing)
	}
	hs := &g.hold
	hs.Start, hs.Records, hs.Readings, hs.Bytes, hs.Since = next, 0, 0, 0, 0
	g.ing.share.reset()
	hs.Rebased += rebased
	hs.Unverified += unverified
	if !g.replaying {
		how := "the clock is synchronized: re-based to true time"
		if !synced {
			how = fmt.Sprintf("the clock was not synchronized within clock.hold_max_age (%v) or clock.hold_max_bytes: aggregated at the gateway's time, unverified", g.opts.HoldMaxAge)
		}
		g.log.Info("held readings released; "+how, "rebased", rebased, "unverified", unverified)
	}
}

// releaseRecord aggregates one held publication's readings at arrival
// base (Unix ns) plus each one's delta; what is refused makes one dead
// letter.
func (g *Gateway) releaseRecord(rec heldRecord, base int64, timing aggregate.Timing) {
	h := &g.ing
	arrival := time.Unix(0, base)
	for _, hr := range rec.readings {
		r := aggregate.Reading{Device: hr.device, Metric: hr.metric, Unit: hr.unit, Value: hr.value,
			Time: time.Unix(0, base+hr.delta), Timing: timing}
		if o := g.agg.Add(r); !o.Accepted() {
			h.refuse(DeadItem{Reason: o.String(), Detail: outcomeDetail(o), HasReading: true, Reading: r}, r.Device)
		}
	}
	if h.dl.Reason != "" {
		d := &h.dl
		d.Source, d.Topic, d.Client, d.ReceivedAt = "mqtt", rec.topic, rec.client, arrival
		g.emitDeadLetter(*d)
		g.logRejected(d.Reason, rec.topic, rec.client, d.Detail, d.ItemsTotal, arrival)
		*d = DeadLetter{Payload: d.Payload[:0], Reasons: d.Reasons[:0], Items: clearItems(d.Items)}
	}
}

// restoreHold takes the hold from a checkpoint, and finds in the hold
// log which publications a replay must not write again.
func (g *Gateway) restoreHold(cp *journal.Checkpoint) {
	if cp != nil {
		g.hold = cp.Hold
	}
	st := g.holdLog.Stats()
	if g.hold.Start > st.Next {
		// The hold log was removed: what the checkpoint held is gone.
		g.log.Error("hold log is behind the checkpoint (was it deleted?); readings held until the clock synchronized are lost",
			"held", g.hold.Readings)
		g.hold.Start, g.hold.Records, g.hold.Readings, g.hold.Bytes, g.hold.Since = st.Next, 0, 0, 0, 0
	}
	if st.Next > st.First {
		r := g.holdLog.NewReader(st.Next - 1)
		defer r.Close()
		if _, data, err := r.Next(); err == nil {
			if rec, err := decodeHeld(data); err == nil {
				g.holdMark = rec.seq
			}
		}
	}
	g.restoreShare(cp)
}

// restoreShare rebuilds what each device holds from the hold log's
// records the checkpoint holds (those of events up to its seq; the
// replay holds the ones after again).
func (g *Gateway) restoreShare(cp *journal.Checkpoint) {
	g.ing.share.reset()
	if cp == nil || g.hold.Records == 0 {
		return
	}
	r := g.holdLog.NewReader(g.hold.Start)
	defer r.Close()
	for {
		_, data, err := r.Next()
		if err != nil {
			return // the end, or what releaseHeld will find unreadable
		}
		rec, err := decodeHeld(data)
		if err != nil {
			continue
		}
		if rec.seq > cp.Seq {
			return
		}
		for _, h := range rec.readings {
			g.ing.share.add(h)
		}
		g.ing.share.addRecord(&rec, len(data))
	}
}

func (g *Gateway) holdStats() HoldStats {
	hs := g.hold
	st := HoldStats{Readings: hs.Readings, Publications: hs.Records, Bytes: hs.Bytes, Rebased: hs.Rebased, Unverified: hs.Unverified,
		Refused: g.ing.share.refused, OverShare: g.ing.share.overShare}
	if hs.Records > 0 {
		st.Age = time.Duration(g.tl.elapsedAt(g.clk.BootID(), g.clk.Monotonic(), g.clk.Now())) - time.Duration(hs.Since)
	}
	return st
}
