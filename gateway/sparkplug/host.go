// Package sparkplug is edgegate's Sparkplug B host application (Eclipse
// Sparkplug 3.0): the state a host keeps per edge node (its session's
// bdSeq, the expected seq, the metric definitions and aliases of its
// NBIRTH and its devices' DBIRTHs, who is online) and what a message does
// to it. Readings come out in the gateway's terms (device, metric, time,
// value); so do the refusals (payload.Error) and the rebirth requests.
//
// The Host does no I/O and has no clock of its own: the gateway applies
// the journaled Sparkplug publications to it in journal order, with each
// event's journaled time, under its lock, so a replay after a crash
// rebuilds the same state; AppendSnapshot and Restore carry it in the
// checkpoint.
package sparkplug

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/gateway/payload"
)

// Namespace is the first topic level of Sparkplug B (Sparkplug 3.0 §4.1).
const Namespace = "spBv1.0"

// Message types (Sparkplug 3.0 §4.1.3) the host ingests.
const (
	NBirth = "NBIRTH"
	NData  = "NDATA"
	NDeath = "NDEATH"
	DBirth = "DBIRTH"
	DData  = "DDATA"
	DDeath = "DDEATH"
)

// Defaults of Options.
const (
	DefaultRebirthInterval   = 10 * time.Second
	DefaultSeparator         = "/"
	DefaultMaxNodes          = 1000
	DefaultMaxMetricsPerNode = 10000
)

// Options configures the host (the sparkplug section of the
// configuration).
type Options struct {
	// HostID names the host in its STATE topic (spBv1.0/STATE/<host_id>).
	HostID string
	// Groups, if not empty, are the only group ids ingested; the others
	// are routed as any MQTT traffic.
	Groups []string
	// RebirthInterval is the least time between two rebirth requests to
	// one edge node.
	RebirthInterval time.Duration
	// Separator joins group, edge node and device into the device name of
	// readings: <group><sep><edge_node>[<sep><device>].
	Separator string
	// Booleans aggregates Boolean metrics as 0 and 1; without it they are
	// counted and not aggregated.
	Booleans bool
	// MaxNodes bounds the edge nodes held, MaxMetricsPerNode the metric
	// definitions of one edge node and its devices.
	MaxNodes          int
	MaxMetricsPerNode int
}

// Topic is a parsed Sparkplug topic: spBv1.0/<group>/<type>/<node>[/<device>].
type Topic struct {
	Group, Type, Node, Device string
}

// ParseTopic parses a topic of the Sparkplug namespace. ok is false for
// any other topic, and for STATE, whose layout differs.
func ParseTopic(topic string) (t Topic, ok bool) {
	rest, found := strings.CutPrefix(topic, Namespace+"/")
	if !found {
		return t, false
	}
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) < 3 || len(parts) > 4 {
		return t, false
	}
	for _, p := range parts {
		if p == "" {
			return t, false
		}
	}
	t = Topic{Group: parts[0], Type: parts[1], Node: parts[2]}
	if len(parts) == 4 {
		t.Device = parts[3]
	}
	return t, true
}

// Host is the Sparkplug host state. It is not safe for concurrent use: the
// gateway calls it under its lock.
type Host struct {
	opts  Options
	nodes map[string]*node // by group + "/" + node id
	p     payload.SparkplugPayload
	c     counters
}

type counters struct {
	messages         [6]uint64 // by message type, in msgTypes order
	rebirths         uint64    // rebirth requests made
	rebirthsHeld     uint64    // rebirth requests not made: one was made within RebirthInterval
	seqGaps          uint64
	staleDeaths      uint64 // NDEATHs of an older session (or of an unknown node), ignored
	historical       uint64 // readings with is_historical
	nulls            uint64 // metrics with is_null: no value, no reading
	notAggregated    uint64 // metrics of a type not aggregated (String, DataSet, Template, ...; Boolean unless Options.Booleans)
	protocolMetrics  uint64 // bdSeq and Node/Device Control metrics: the protocol's, not readings
	unknownAliases   uint64
	beforeBirth      uint64 // DATA, DBIRTH or DDEATH with no BIRTH of the session
	tooManyMetrics   uint64
	tooManyNodes     uint64
	readings         uint64
	deathsOfSessions uint64 // NDEATHs that ended the session they name
}

var msgTypes = [6]string{NBirth, NData, NDeath, DBirth, DData, DDeath}

type node struct {
	group, id string
	name      string // the device name of its own readings: group<sep>id
	online    bool
	born      bool  // its NBIRTH of the current session was seen
	bdSeq     int64 // of the current session; -1: not known
	seq       int   // the seq expected next; -1: any
	// lastRebirth is the event time (Unix ns) of the latest rebirth
	// request; 0: none.
	lastRebirth int64
	lastSeen    int64
	devices     map[string]*device // by device id; "" is the node itself
	aliases     map[uint64]int32   // alias → index in metrics
	metrics     []metricDef
}

type device struct {
	id     string // within its node; "" for the node itself
	name   string // the device name of its readings
	online bool
	born   bool
	byName map[string]int32 // metric name → index in node.metrics
}

type metricDef struct {
	device   string // device id, "" for the node's own
	name     string
	datatype uint32
	alias    uint64
	hasAlias bool
}

// Handler receives what a message yields: readings, refused metrics (or
// the whole message refused), and rebirth requests that are due.
type Handler interface {
	Reading(r aggregate.Reading)
	Reject(err *payload.Error)
	// Rebirth asks the edge node for a new BIRTH (an NCMD with
	// Node Control/Rebirth). It is called at most once per
	// Options.RebirthInterval per edge node, by event time.
	Rebirth(group, node string)
}

// New returns an empty host; zero options take their defaults.
func New(o Options) *Host {
	if o.RebirthInterval <= 0 {
		o.RebirthInterval = DefaultRebirthInterval
	}
	if o.Separator == "" {
		o.Separator = DefaultSeparator
	}
	if o.MaxNodes <= 0 {
		o.MaxNodes = DefaultMaxNodes
	}
	if o.MaxMetricsPerNode <= 0 {
		o.MaxMetricsPerNode = DefaultMaxMetricsPerNode
	}
	return &Host{opts: o, nodes: map[string]*node{}}
}

// Options returns the host's options, defaults filled in.
func (h *Host) Options() Options { return h.opts }

// Ingests reports whether a topic is a Sparkplug message the host takes:
// a BIRTH, DATA or DEATH of a group it serves. Commands (NCMD, DCMD) and
// STATE are not readings.
func (h *Host) Ingests(topic string) (Topic, bool) {
	t, ok := ParseTopic(topic)
	if !ok {
		return t, false
	}
	switch t.Type {
	case NBirth, NData, NDeath:
		if t.Device != "" {
			return t, false
		}
	case DBirth, DData, DDeath:
		if t.Device == "" {
			return t, false
		}
	default:
		return t, false
	}
	if len(h.opts.Groups) > 0 && !slices.Contains(h.opts.Groups, t.Group) {
		return t, false
	}
	return t, true
}

// DeviceName returns the device name of a topic's readings (or of its
// edge node, for node messages).
func (h *Host) DeviceName(t Topic) string {
	s := t.Group + h.opts.Separator + t.Node
	if t.Device != "" {
		s += h.opts.Separator + t.Device
	}
	return s
}

func nodeKey(group, id string) string { return group + "/" + id }

// msgIndex returns the index of a message type in msgTypes.
func msgIndex(typ string) int {
	for i, m := range msgTypes {
		if m == typ {
			return i
		}
	}
	return -1
}

// Apply applies one Sparkplug publication on topic t (as Ingests returned
// it), which arrived at now (the journaled time: the clock of readings
// without timestamps and of rebirth rates). Everything it does depends
// on the message and the state alone.
func (h *Host) Apply(t Topic, body []byte, now time.Time, out Handler) {
	if i := msgIndex(t.Type); i >= 0 {
		h.c.messages[i]++
	}
	if err := payload.DecodeSparkplug(body, &h.p); err != nil {
		var e *payload.Error
		if errors.As(err, &e) {
			out.Reject(e)
		}
		return
	}
	key := nodeKey(t.Group, t.Node)
	n := h.nodes[key]
	if n == nil {
		if t.Type == NDeath {
			h.c.staleDeaths++ // of a session the host never saw: nothing to end
			return
		}
		if len(h.nodes) >= h.opts.MaxNodes {
			h.c.tooManyNodes++
			out.Reject(&payload.Error{Reason: payload.ReasonTooManyNodes, Item: key,
				Detail: fmt.Sprintf("a new edge node over sparkplug.max_nodes (%d); raise it, or end the sessions of nodes that are gone (their NDEATH)", h.opts.MaxNodes)})
			return
		}
		// The topic aliases the caller's record, which is reused: the
		// names kept are copies.
		n = &node{group: strings.Clone(t.Group), id: strings.Clone(t.Node), name: t.Group + h.opts.Separator + t.Node, bdSeq: -1, seq: -1}
		h.nodes[key] = n
	}
	n.lastSeen = now.UnixNano()
	switch t.Type {
	case NBirth:
		h.nbirth(n, now, out)
	case NDeath:
		h.ndeath(n)
	case NData:
		if h.checkSession(n, t, now, out) {
			h.data(n, n.devices[""], now, out)
		}
	case DBirth:
		if h.checkSession(n, t, now, out) {
			h.dbirth(n, t.Device, now, out)
		}
	case DData:
		if !h.checkSession(n, t, now, out) {
			return
		}
		d := n.devices[t.Device]
		if d == nil || !d.born {
			h.beforeBirth(n, t, now, out, "a DDATA of a device whose DBIRTH the host has not seen in this session")
			return
		}
		h.data(n, d, now, out)
	case DDeath:
		if !h.checkSession(n, t, now, out) {
			return
		}
		if d := n.devices[t.Device]; d != nil {
			h.dropDevice(n, t.Device)
			d.online, d.born = false, false
		}
	}
}

// checkSession checks that the edge node has a session (its NBIRTH was
// seen) and that the message's seq is the one expected; a gap asks for a
// rebirth (the missing messages may have been a DBIRTH) and the message is
// still used. It reports whether the message can be used.
func (h *Host) checkSession(n *node, t Topic, now time.Time, out Handler) bool {
	if !n.born {
		h.beforeBirth(n, t, now, out, "a "+t.Type+" of an edge node whose NBIRTH the host has not seen in this session")
		return false
	}
	if h.p.HasSeq && n.seq >= 0 && h.p.Seq != uint64(n.seq) {
		h.c.seqGaps++
		h.rebirth(n, now, out)
	}
	if h.p.HasSeq {
		n.seq = int((h.p.Seq + 1) % 256)
	}
	return true
}

// beforeBirth refuses a message that needs a BIRTH the host has not seen,
// and asks for one.
func (h *Host) beforeBirth(n *node, t Topic, now time.Time, out Handler, what string) {
	h.c.beforeBirth++
	out.Reject(&payload.Error{Reason: payload.ReasonNoBirth, Item: h.DeviceName(t),
		Detail: what + "; its metrics cannot be resolved, so the host asks the edge node to rebirth (Node Control/Rebirth)"})
	h.rebirth(n, now, out)
}

// rebirth asks the edge node for a rebirth, at most once per
// RebirthInterval.
func (h *Host) rebirth(n *node, now time.Time, out Handler) {
	if n.lastRebirth != 0 && now.UnixNano()-n.lastRebirth < int64(h.opts.RebirthInterval) {
		h.c.rebirthsHeld++
		return
	}
	n.lastRebirth = now.UnixNano()
	h.c.rebirths++
	out.Rebirth(n.group, n.id)
}

// nbirth starts a new session of the edge node: every definition of the
// old session, its devices' too, is dropped.
func (h *Host) nbirth(n *node, now time.Time, out Handler) {
	n.online, n.born = true, true
	n.bdSeq = -1
	n.seq = -1
	if h.p.HasSeq {
		n.seq = int((h.p.Seq + 1) % 256)
	}
	// The devices of the old session stay listed, offline, until their
	// DBIRTH.
	for _, d := range n.devices {
		d.online, d.born = false, false
		clear(d.byName)
	}
	if n.devices == nil {
		n.devices = map[string]*device{}
	}
	n.devices[""] = &device{name: n.name, online: true, born: true, byName: map[string]int32{}}
	if n.aliases == nil {
		n.aliases = map[uint64]int32{}
	}
	clear(n.aliases)
	clear(n.metrics)
	n.metrics = n.metrics[:0]
	for i := range h.p.Metrics {
		m := &h.p.Metrics[i]
		if string(m.Name) == "bdSeq" {
			if v, err := m.Value(orDefault(m, payload.SpInt64)); err == nil && v >= 0 {
				n.bdSeq = int64(v)
			}
		}
	}
	h.birth(n, "", now, out)
}

// dbirth (re)defines a device of the edge node.
func (h *Host) dbirth(n *node, id string, now time.Time, out Handler) {
	h.dropDevice(n, id)
	d := n.devices[id]
	if d == nil {
		// Each device costs a metric definition's worth of the bound.
		if len(n.devices)+len(n.metrics) >= h.opts.MaxMetricsPerNode {
			h.c.tooManyMetrics++
			out.Reject(&payload.Error{Reason: payload.ReasonTooManyMetrics, Item: id,
				Detail: fmt.Sprintf("a new device over sparkplug.max_metrics_per_node (%d, devices and metrics of one edge node); raise it", h.opts.MaxMetricsPerNode)})
			return
		}
		id = strings.Clone(id) // as the node's names
		d = &device{id: id, name: n.name + h.opts.Separator + id}
		n.devices[id] = d
	}
	d.online, d.born, d.byName = true, true, map[string]int32{}
	h.birth(n, d.id, now, out)
}

func orDefault(m *payload.SparkplugMetric, dt uint32) uint32 {
	if m.HasDatatype {
		return m.Datatype
	}
	return dt
}

// birth defines the metrics of a BIRTH and takes their values as
// readings.
func (h *Host) birth(n *node, dev string, now time.Time, out Handler) {
	d := n.devices[dev]
	for i := range h.p.Metrics {
		m := &h.p.Metrics[i]
		if !m.HasName {
			out.Reject(&payload.Error{Reason: payload.ReasonName, Item: fmt.Sprintf("metric %d", i), Detail: "a BIRTH metric must have a name (Sparkplug 3.0 §6.4.1)"})
			continue
		}
		if e := payload.CheckSparkplugName(m.Name); e != nil {
			out.Reject(e)
			continue
		}
		if !m.HasDatatype {
			out.Reject(&payload.Error{Reason: payload.ReasonForm, Item: string(m.Name), Detail: "a BIRTH metric must have a datatype (Sparkplug 3.0 §6.4.1)"})
			continue
		}
		idx, known := d.byName[string(m.Name)]
		if !known {
			if len(n.metrics) >= h.opts.MaxMetricsPerNode {
				h.c.tooManyMetrics++
				out.Reject(&payload.Error{Reason: payload.ReasonTooManyMetrics, Item: string(m.Name),
					Detail: fmt.Sprintf("the edge node defines more metrics than sparkplug.max_metrics_per_node (%d); raise it", h.opts.MaxMetricsPerNode)})
				continue
			}
			idx = int32(len(n.metrics))
			n.metrics = append(n.metrics, metricDef{device: dev, name: string(m.Name)})
			d.byName[n.metrics[idx].name] = idx
		}
		def := &n.metrics[idx]
		def.datatype = m.Datatype
		if m.HasAlias {
			if other, taken := n.aliases[m.Alias]; taken && other != idx {
				// Aliases are unique within an edge node (Sparkplug 3.0
				// §6.4.1): the later definition wins.
				n.metrics[other].hasAlias = false
			}
			def.alias, def.hasAlias = m.Alias, true
			n.aliases[m.Alias] = idx
		}
		h.reading(n, d, def, m, now, out)
	}
}

// dropDevice removes a device's metric definitions and aliases.
func (h *Host) dropDevice(n *node, id string) {
	if n.devices[id] == nil {
		return
	}
	keep := n.metrics[:0]
	for _, m := range n.metrics {
		if m.device != id {
			keep = append(keep, m)
		}
	}
	clear(n.metrics[len(keep):])
	n.metrics = keep
	h.reindex(n)
}

// reindex rebuilds the alias and name maps from n.metrics.
func (h *Host) reindex(n *node) {
	clear(n.aliases)
	for _, d := range n.devices {
		clear(d.byName)
	}
	for i, m := range n.metrics {
		if m.hasAlias {
			n.aliases[m.alias] = int32(i)
		}
		if d := n.devices[m.device]; d != nil {
			d.byName[m.name] = int32(i)
		}
	}
}

// ndeath ends the edge node's session if the NDEATH is of it (its bdSeq
// is the NBIRTH's); an NDEATH of an older session, delivered late (the
// will of a connection the node has since replaced), is ignored.
func (h *Host) ndeath(n *node) {
	bd := int64(-1)
	for i := range h.p.Metrics {
		m := &h.p.Metrics[i]
		if string(m.Name) == "bdSeq" {
			if v, err := m.Value(orDefault(m, payload.SpInt64)); err == nil && v >= 0 {
				bd = int64(v)
			}
		}
	}
	if !n.online || bd >= 0 && n.bdSeq >= 0 && bd != n.bdSeq {
		h.c.staleDeaths++
		return
	}
	h.c.deathsOfSessions++
	n.online, n.born, n.seq = false, false, -1
	for _, d := range n.devices {
		d.online, d.born = false, false
		clear(d.byName)
	}
	clear(n.metrics)
	n.metrics = n.metrics[:0]
	clear(n.aliases)
}

// data resolves the metrics of an NDATA or DDATA by alias or name.
func (h *Host) data(n *node, d *device, now time.Time, out Handler) {
	lost := false
	for i := range h.p.Metrics {
		m := &h.p.Metrics[i]
		idx, ok := int32(0), false
		switch {
		case m.HasAlias:
			idx, ok = n.aliases[m.Alias]
			ok = ok && n.metrics[idx].device == d.id
		case m.HasName:
			idx, ok = d.byName[string(m.Name)]
		}
		if !ok {
			lost = true
			h.c.unknownAliases++
			item := fmt.Sprintf("alias %d", m.Alias)
			if !m.HasAlias {
				item = string(m.Name)
				if !m.HasName {
					item = fmt.Sprintf("metric %d", i)
				}
			}
			out.Reject(&payload.Error{Reason: payload.ReasonUnknownAlias, Item: item,
				Detail: "no metric of the " + d.name + " BIRTH has this alias or name; the host asks the edge node to rebirth"})
			continue
		}
		h.reading(n, d, &n.metrics[idx], m, now, out)
	}
	if lost {
		h.rebirth(n, now, out)
	}
}

// reading makes a reading of a metric's value, if it has one edgegate
// aggregates.
func (h *Host) reading(n *node, d *device, def *metricDef, m *payload.SparkplugMetric, now time.Time, out Handler) {
	if def.device == "" && def.name == "bdSeq" || strings.HasPrefix(def.name, "Node Control/") || strings.HasPrefix(def.name, "Device Control/") {
		h.c.protocolMetrics++
		return
	}
	if m.IsNull {
		h.c.nulls++
		return
	}
	dt := def.datatype
	if m.HasDatatype {
		dt = m.Datatype
	}
	if !payload.SpNumeric(dt, h.opts.Booleans) {
		h.c.notAggregated++
		return
	}
	v, err := m.Value(dt)
	if err != nil {
		err.Item = def.name
		out.Reject(err)
		return
	}
	at := now
	switch {
	case m.HasTimestamp:
		at, err = msTime(m.Timestamp, def.name)
	case h.p.HasTimestamp:
		at, err = msTime(h.p.Timestamp, def.name)
	}
	if err != nil {
		out.Reject(err)
		return
	}
	if m.IsHistorical {
		h.c.historical++
	}
	h.c.readings++
	out.Reading(aggregate.Reading{Device: d.name, Metric: def.name, Time: at, Value: v})
}

// msTime converts a Sparkplug timestamp (ms since the Unix epoch, UTC).
func msTime(ms uint64, item string) (time.Time, *payload.Error) {
	if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return time.Time{}, &payload.Error{Reason: payload.ReasonTimestamp, Item: item, Detail: fmt.Sprintf("timestamp %d ms is out of range", ms)}
	}
	return time.UnixMilli(int64(ms)), nil
}
