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
//
// What one publisher can make it hold is bounded: a device-role identity
// (whose edge node id is its identity, by the ACL) is bound to one edge
// node, the first it births (Event.Identity), which holds at most
// MaxDevicesPerNode devices and MaxMetricsPerNode metric definitions;
// MaxNodes and MaxMetrics bound all edge nodes together. An edge node
// dead for ForgetAfter of the journal's elapsed time, and a device offline
// that long, are forgotten, and so are their readings' devices in the
// aggregator (Handler.Forget).
package sparkplug

import (
	"errors"
	"fmt"
	"maps"
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
	DefaultMaxDevicesPerNode = 100
	DefaultMaxMetrics        = 100_000
	DefaultForgetAfter       = 24 * time.Hour
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
	// MaxDevicesPerNode bounds the devices of one edge node; MaxMetrics
	// the metric definitions and devices of all edge nodes together.
	MaxDevicesPerNode int
	MaxMetrics        int
	// ForgetAfter is how long an edge node stays known after its death
	// (NDEATH, or its will), and a device after it went offline, while
	// nothing is heard of it: by elapsed time (Event.Elapsed).
	ForgetAfter time.Duration
}

// Event is what the journal records of a Sparkplug publication besides its
// topic and body: everything Apply depends on, so a replay decides the
// same.
type Event struct {
	// Now is the gateway time of its arrival: the time of readings
	// without timestamps, the clock of rebirth requests and of LastSeen.
	Now time.Time
	// Elapsed is the journal's elapsed time at its arrival (monotonic,
	// never backwards, not counting time the gateway was down): the
	// clock of ForgetAfter.
	Elapsed time.Duration
	// Identity is the publisher's identity if it has the device role,
	// whose edge node id it is (the gateway refuses other node ids before
	// Apply); "" for a publisher of another role, bound to nothing.
	Identity string
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
	// bound is the edge node each device-role identity is bound to, by
	// identity (its node id).
	bound map[string]*node
	// defs counts the metric definitions and devices of all edge nodes
	// (MaxMetrics), except for the message being applied, whose node's
	// are counted in base until it is done.
	defs, base int
	// elapsed is the Event.Elapsed of the message being applied (ns);
	// nextForget the elapsed time at or after which an edge node or a
	// device may be due to be forgotten (0: none is offline).
	elapsed, nextForget int64
	p                   payload.SparkplugPayload
	c                   counters
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
	tooManyDevices   uint64
	identityBound    uint64 // messages of a device identity for an edge node other than its own
	forgotten        [numForgets]uint64
}

// Why an edge node or a device was forgotten.
const (
	forgotDead     = iota // an edge node dead for ForgetAfter
	forgotReplaced        // an offline edge node whose identity births another
	forgotSilent          // a device offline for ForgetAfter
	numForgets
)

var forgetReasons = [numForgets]string{"node_dead", "node_replaced", "device_silent"}

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
	seenAt      int64 // Event.Elapsed of its latest message (ns)
	// bound: its device-role identity (its id) is bound to it.
	bound   bool
	devices map[string]*device // by device id; "" is the node itself
	aliases map[uint64]int32   // alias → index in metrics
	metrics []metricDef
}

type device struct {
	id     string // within its node; "" for the node itself
	name   string // the device name of its readings
	online bool
	born   bool
	seenAt int64            // Event.Elapsed of its latest message (ns)
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
	// Counted reports whether a refusal for reason was counted without
	// its details: the message's dead letter lists no more items, and
	// names this reason already. The host then does not make the
	// refusal (a message of 60,000 unknown aliases costs a count each).
	Counted(reason payload.Reason) bool
	// Forget says that the readings of device (an edge node's or a
	// device's name) will not be held: the edge node or device was
	// forgotten.
	Forget(device string)
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
	if o.MaxDevicesPerNode <= 0 {
		o.MaxDevicesPerNode = DefaultMaxDevicesPerNode
	}
	if o.MaxMetrics <= 0 {
		o.MaxMetrics = DefaultMaxMetrics
	}
	if o.ForgetAfter <= 0 {
		o.ForgetAfter = DefaultForgetAfter
	}
	return &Host{opts: o, nodes: map[string]*node{}, bound: map[string]*node{}}
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
// it), journaled as ev says. Everything it does depends on the message,
// ev and the state alone. First it forgets what is due (Expire).
func (h *Host) Apply(t Topic, body []byte, ev Event, out Handler) {
	h.Expire(ev.Elapsed, out)
	now := ev.Now
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
	if ev.Identity != "" {
		if b := h.bound[ev.Identity]; b != nil && b != n {
			if t.Type != NBirth || b.online {
				h.c.identityBound++
				out.Reject(&payload.Error{Reason: payload.ReasonIdentityBound, Item: key,
					Detail: "the publisher's identity is bound to edge node " + b.group + "/" + b.id + " (its first NBIRTH); it may birth in another group once that node is offline (its NDEATH)"})
				return
			}
			// The node moves to another group: one node per identity.
			h.forgetNode(b, forgotReplaced, out)
		}
	}
	if n == nil {
		if t.Type == NDeath {
			h.c.staleDeaths++ // of a session the host never saw: nothing to end
			return
		}
		if len(h.nodes) >= h.opts.MaxNodes {
			h.c.tooManyNodes++
			out.Reject(&payload.Error{Reason: payload.ReasonTooManyNodes, Item: key,
				Detail: fmt.Sprintf("a new edge node over sparkplug.max_nodes (%d); raise it, or end the sessions of nodes that are gone (their NDEATH; they are forgotten after sparkplug.forget_after)", h.opts.MaxNodes)})
			return
		}
		// The topic aliases the caller's record, which is reused: the
		// names kept are copies.
		n = &node{group: strings.Clone(t.Group), id: strings.Clone(t.Node), name: t.Group + h.opts.Separator + t.Node, bdSeq: -1, seq: -1}
		h.nodes[key] = n
	}
	if ev.Identity != "" && !n.bound {
		n.bound = true
		h.bound[n.id] = n
	}
	n.lastSeen = now.UnixNano()
	n.seenAt = h.elapsed
	h.base = n.size()
	defer func() { h.defs += n.size() - h.base; h.base = 0 }()
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
		d.seenAt = h.elapsed
		h.data(n, d, now, out)
	case DDeath:
		if !h.checkSession(n, t, now, out) {
			return
		}
		if d := n.devices[t.Device]; d != nil {
			h.dropDevice(n, t.Device)
			d.online, d.born = false, false
			d.seenAt = h.elapsed
			h.due(d.seenAt)
		}
	}
}

// size is what a node counts in Host.defs.
func (n *node) size() int { return len(n.metrics) + len(n.devices) }

// total returns the metric definitions and devices of all edge nodes,
// while a message of n is applied.
func (h *Host) total(n *node) int { return h.defs - h.base + n.size() }

// due notes that something offline since seenAt (elapsed ns) is to be
// forgotten ForgetAfter later.
func (h *Host) due(seenAt int64) {
	at := seenAt + int64(h.opts.ForgetAfter)
	if h.nextForget == 0 || at < h.nextForget {
		h.nextForget = at
	}
}

// Due reports whether Expire at elapsed time elapsed would forget
// something (for a caller that journals ticks only when they can change
// anything).
func (h *Host) Due(elapsed time.Duration) bool {
	return h.nextForget != 0 && int64(elapsed) >= h.nextForget
}

// Expire forgets, as of elapsed time elapsed (the journal's, of the event
// being applied: never a live clock), the edge nodes dead and the devices
// offline for ForgetAfter, in the order of their names (the aggregator
// emits what Forget closes in that order, the same in a replay), and
// tells out of each reading device no longer held.
func (h *Host) Expire(elapsed time.Duration, out Handler) {
	h.elapsed = max(h.elapsed, int64(elapsed))
	if !h.Due(time.Duration(h.elapsed)) {
		return
	}
	h.scan(out)
}

// scan forgets what is due (with out; nil: nothing, only the next time is
// found) and sets nextForget.
func (h *Host) scan(out Handler) {
	horizon := int64(h.opts.ForgetAfter)
	h.nextForget = 0
	var nodes, devices []string
	for k, n := range h.nodes {
		if !n.online {
			if h.elapsed-n.seenAt >= horizon && out != nil {
				nodes = append(nodes, k)
			} else {
				h.due(n.seenAt)
			}
			continue
		}
		for id, d := range n.devices {
			if id == "" || d.online {
				continue
			}
			if h.elapsed-d.seenAt >= horizon && out != nil {
				devices = append(devices, k+"\x00"+id)
			} else {
				h.due(d.seenAt)
			}
		}
	}
	slices.Sort(nodes)
	for _, k := range nodes {
		h.forgetNode(h.nodes[k], forgotDead, out)
	}
	slices.Sort(devices)
	for _, kd := range devices {
		k, id, _ := strings.Cut(kd, "\x00")
		n := h.nodes[k]
		d := n.devices[id]
		h.dropDevice(n, id)
		delete(n.devices, id)
		h.defs--
		h.c.forgotten[forgotSilent]++
		out.Forget(d.name)
	}
}

// forgetNode drops an edge node and its devices, and their readings'
// devices in the aggregator.
func (h *Host) forgetNode(n *node, why int, out Handler) {
	h.c.forgotten[why]++
	h.defs -= n.size()
	if n.devices[""] == nil {
		out.Forget(n.name) // never born, but it may have had readings
	}
	for _, id := range slices.Sorted(maps.Keys(n.devices)) {
		out.Forget(n.devices[id].name)
	}
	delete(h.nodes, nodeKey(n.group, n.id))
	if n.bound && h.bound[n.id] == n {
		delete(h.bound, n.id)
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
		if d.online {
			h.due(d.seenAt)
		}
		d.online, d.born = false, false
		clear(d.byName)
	}
	if n.devices == nil {
		n.devices = map[string]*device{}
	}
	n.devices[""] = &device{name: n.name, online: true, born: true, seenAt: h.elapsed, byName: map[string]int32{}}
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
		// The node itself is n.devices[""].
		if len(n.devices) > h.opts.MaxDevicesPerNode {
			h.c.tooManyDevices++
			out.Reject(&payload.Error{Reason: payload.ReasonTooManyDevices, Item: id,
				Detail: fmt.Sprintf("a new device over sparkplug.max_devices_per_node (%d); raise it, or let the devices that are gone go (DDEATH; they are forgotten after sparkplug.forget_after)", h.opts.MaxDevicesPerNode)})
			return
		}
		// Each device costs a metric definition's worth of the bounds.
		if len(n.devices)+len(n.metrics) >= h.opts.MaxMetricsPerNode || h.total(n) >= h.opts.MaxMetrics {
			h.c.tooManyMetrics++
			out.Reject(&payload.Error{Reason: payload.ReasonTooManyMetrics, Item: id,
				Detail: fmt.Sprintf("a new device over sparkplug.max_metrics_per_node (%d, devices and metrics of one edge node) or sparkplug.max_metrics (%d, of all); raise it", h.opts.MaxMetricsPerNode, h.opts.MaxMetrics)})
			return
		}
		id = strings.Clone(id) // as the node's names
		d = &device{id: id, name: n.name + h.opts.Separator + id}
		n.devices[id] = d
	}
	d.online, d.born, d.byName, d.seenAt = true, true, map[string]int32{}, h.elapsed
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
			if len(n.metrics) >= h.opts.MaxMetricsPerNode || h.total(n) >= h.opts.MaxMetrics {
				h.c.tooManyMetrics++
				if out.Counted(payload.ReasonTooManyMetrics) {
					continue
				}
				out.Reject(&payload.Error{Reason: payload.ReasonTooManyMetrics, Item: string(m.Name),
					Detail: fmt.Sprintf("the edge node defines more metrics than sparkplug.max_metrics_per_node (%d), or all edge nodes more than sparkplug.max_metrics (%d); raise it", h.opts.MaxMetricsPerNode, h.opts.MaxMetrics)})
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
	h.due(n.seenAt)
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
			if out.Counted(payload.ReasonUnknownAlias) {
				continue // past the dead letter's items: counted, not described
			}
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
