package sparkplug

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/edgegate/edgegate/gateway/payload"
)

// The host state in a checkpoint (gateway/journal's checkpoint section
// 'S'), integers as Go varints, strings as uvarint length + bytes:
//
//	version 2 (1 byte)
//	uvarint count, then per edge node, sorted by group and id:
//	  string group, string id, flags (bit 0 online, bit 1 born,
//	  bit 2 bound to its device-role identity),
//	  varint bdSeq (-1: unknown), varint expected seq (-1: any),
//	  varint last rebirth request (Unix ns, 0: none), varint last seen,
//	  varint elapsed time of its latest message (ns),
//	  uvarint count, then per device sorted by id ("" the node itself):
//	    string id, flags (bit 0 online, bit 1 born),
//	    varint elapsed time of its latest message (ns)
//	  uvarint count, then per metric definition in definition order:
//	    string device id, string name, uvarint datatype,
//	    flags (bit 0 has alias), uvarint alias
//
// Version 1 has neither the elapsed times nor bit 2: its edge nodes and
// devices are read as last heard of at the checkpoint's elapsed time, and
// bound to nothing (a device identity's next message binds its node).
const stateVersion = 2

var errState = errors.New("undecodable Sparkplug host state")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func flags(bits ...bool) byte {
	var f byte
	for i, b := range bits {
		if b {
			f |= 1 << i
		}
	}
	return f
}

// AppendSnapshot appends the host state (for the checkpoint). With no edge
// node known it appends nothing, so a gateway that never saw Sparkplug
// writes the checkpoints it wrote before.
func (h *Host) AppendSnapshot(b []byte) []byte {
	if len(h.nodes) == 0 {
		return b
	}
	b = append(b, stateVersion)
	keys := slices.Sorted(maps.Keys(h.nodes))
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		n := h.nodes[k]
		b = appendString(b, n.group)
		b = appendString(b, n.id)
		b = append(b, flags(n.online, n.born, n.bound))
		b = binary.AppendVarint(b, n.bdSeq)
		b = binary.AppendVarint(b, int64(n.seq))
		b = binary.AppendVarint(b, n.lastRebirth)
		b = binary.AppendVarint(b, n.lastSeen)
		b = binary.AppendVarint(b, n.seenAt)
		ids := slices.Sorted(maps.Keys(n.devices))
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			d := n.devices[id]
			b = appendString(b, id)
			b = append(b, flags(d.online, d.born))
			b = binary.AppendVarint(b, d.seenAt)
		}
		b = binary.AppendUvarint(b, uint64(len(n.metrics)))
		for _, m := range n.metrics {
			b = appendString(b, m.device)
			b = appendString(b, m.name)
			b = binary.AppendUvarint(b, uint64(m.datatype))
			b = append(b, flags(m.hasAlias))
			b = binary.AppendUvarint(b, m.alias)
		}
	}
	return b
}

type reader struct {
	b  []byte
	ok bool
}

func (r *reader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) varint() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.ok = false
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) str() string {
	n := r.uvarint()
	if !r.ok || n > uint64(len(r.b)) {
		r.ok = false
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads a count of items that take at least min bytes each.
func (r *reader) count(min int) int {
	n := r.uvarint()
	if n > uint64(len(r.b)/min) {
		r.ok = false
		return 0
	}
	return int(n)
}

// Restore replaces the host state with a snapshot's (empty: no edge
// node), at elapsed time elapsed (the checkpoint's, which the state of a
// version 1 snapshot is taken as last heard of at). On error the state is
// left empty.
func (h *Host) Restore(b []byte, elapsed time.Duration) error {
	h.nodes, h.bound, h.defs, h.nextForget = map[string]*node{}, map[string]*node{}, 0, 0
	h.elapsed = int64(elapsed)
	if len(b) == 0 {
		return nil
	}
	version := b[0]
	if version != 1 && version != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", errState, version, stateVersion)
	}
	r := reader{b: b[1:], ok: true}
	seen := func() int64 {
		if version == 1 {
			return int64(elapsed)
		}
		return r.varint()
	}
	nodes, bound, defs := map[string]*node{}, map[string]*node{}, 0
	for range r.count(8) {
		n := &node{group: r.str(), id: r.str()}
		f := r.byte()
		n.online, n.born, n.bound = f&1 != 0, f&2 != 0, f&4 != 0
		n.bdSeq = r.varint()
		n.seq = int(r.varint())
		n.lastRebirth = r.varint()
		n.lastSeen = r.varint()
		n.seenAt = seen()
		n.name = n.group + h.opts.Separator + n.id
		n.devices = map[string]*device{}
		n.aliases = map[uint64]int32{}
		for range r.count(2) {
			id := r.str()
			f := r.byte()
			d := &device{id: id, name: n.name, online: f&1 != 0, born: f&2 != 0, byName: map[string]int32{}}
			d.seenAt = seen()
			if id != "" {
				d.name += h.opts.Separator + id
			}
			n.devices[id] = d
		}
		for range r.count(5) {
			m := metricDef{device: r.str(), name: r.str(), datatype: uint32(r.uvarint())}
			m.hasAlias = r.byte()&1 != 0
			m.alias = r.uvarint()
			n.metrics = append(n.metrics, m)
		}
		if !r.ok || n.seq < -1 || n.seq > 255 {
			return errState
		}
		h.reindex(n)
		nodes[nodeKey(n.group, n.id)] = n
		defs += n.size()
		if n.bound {
			if bound[n.id] != nil {
				return fmt.Errorf("%w: identity %q bound to two edge nodes", errState, n.id)
			}
			bound[n.id] = n
		}
	}
	if !r.ok || len(r.b) != 0 {
		return errState
	}
	h.nodes, h.bound, h.defs = nodes, bound, defs
	h.scan(nil)
	return nil
}

// Stats is a snapshot of the host's state and counters.
type Stats struct {
	Nodes, NodesOnline     int
	Devices, DevicesOnline int // devices of the edge nodes (not counting the nodes)
	// Messages counts the Sparkplug publications applied, by type.
	Messages map[string]uint64
	Readings uint64
	// Historical counts readings with is_historical (sent after an
	// outage from the edge node's store).
	Historical uint64
	// RebirthRequests counts NCMD Node Control/Rebirth requests made;
	// RebirthsHeld those not made because one had been made within
	// sparkplug.rebirth_interval.
	RebirthRequests, RebirthsHeld uint64
	SeqGaps                       uint64
	// UnknownAliases counts DATA metrics no BIRTH defined; BeforeBirth
	// messages refused because the BIRTH of their session was not seen.
	UnknownAliases, BeforeBirth uint64
	// SessionsEnded counts NDEATHs that ended their session; StaleDeaths
	// those of an older session (or of a node never seen), ignored.
	SessionsEnded, StaleDeaths uint64
	// Nulls counts metrics with is_null; NotAggregated metrics of a
	// datatype not aggregated (String, DateTime, DataSet, Template,
	// arrays; Boolean without sparkplug.booleans); Protocol the bdSeq and
	// Node/Device Control metrics.
	Nulls, NotAggregated, Protocol uint64
	// TooManyNodes, TooManyMetrics and TooManyDevices count what the
	// bounds refused; IdentityBound the messages of a device-role
	// identity for an edge node other than the one it is bound to.
	TooManyNodes, TooManyMetrics, TooManyDevices, IdentityBound uint64
	// Forgotten counts the edge nodes and devices forgotten, by reason:
	// node_dead (dead for sparkplug.forget_after), node_replaced (offline,
	// and its identity birthed in another group), device_silent (offline
	// for sparkplug.forget_after).
	Forgotten map[string]uint64
	// Definitions counts the metric definitions and devices held, of
	// sparkplug.max_metrics.
	Definitions int
	// NodeList lists up to 1,000 edge nodes, sorted.
	NodeList []NodeStat
}

// NodeStat is one edge node's state, for the status page.
type NodeStat struct {
	Group, Node string
	Online      bool
	BdSeq       int64 // of the current session; -1: not known
	// Seq is the seq expected next (-1: any).
	Seq      int
	LastSeen time.Time
	Metrics  int // metric definitions of the node and its devices
	Devices  []DeviceStat
}

// DeviceStat is one device of an edge node.
type DeviceStat struct {
	ID     string
	Online bool
}

// maxNodeStats bounds Stats.NodeList.
const maxNodeStats = 1000

// Stats returns a snapshot of the state and counters.
func (h *Host) Stats() Stats {
	c := &h.c
	s := Stats{Messages: map[string]uint64{}, Readings: c.readings, Historical: c.historical, RebirthRequests: c.rebirths,
		RebirthsHeld: c.rebirthsHeld, SeqGaps: c.seqGaps, UnknownAliases: c.unknownAliases, BeforeBirth: c.beforeBirth,
		SessionsEnded: c.deathsOfSessions, StaleDeaths: c.staleDeaths, Nulls: c.nulls, NotAggregated: c.notAggregated,
		Protocol: c.protocolMetrics, TooManyNodes: c.tooManyNodes, TooManyMetrics: c.tooManyMetrics,
		TooManyDevices: c.tooManyDevices, IdentityBound: c.identityBound, Forgotten: map[string]uint64{}, Definitions: h.defs}
	for i, r := range forgetReasons {
		s.Forgotten[r] = c.forgotten[i]
	}
	for i, t := range msgTypes {
		s.Messages[t] = c.messages[i]
	}
	for _, k := range slices.Sorted(maps.Keys(h.nodes)) {
		n := h.nodes[k]
		s.Nodes++
		if n.online {
			s.NodesOnline++
		}
		var ds []DeviceStat
		for _, id := range slices.Sorted(maps.Keys(n.devices)) {
			if id == "" {
				continue
			}
			d := n.devices[id]
			s.Devices++
			if d.online {
				s.DevicesOnline++
			}
			ds = append(ds, DeviceStat{ID: id, Online: d.online})
		}
		if len(s.NodeList) < maxNodeStats {
			s.NodeList = append(s.NodeList, NodeStat{Group: n.group, Node: n.id, Online: n.online, BdSeq: n.bdSeq, Seq: n.seq,
				LastSeen: time.Unix(0, n.lastSeen).UTC(), Metrics: len(n.metrics), Devices: ds})
		}
	}
	return s
}

// StateTopic is the topic of the host's STATE message (Sparkplug 3.0
// §4.1.2.1).
func StateTopic(hostID string) string { return Namespace + "/STATE/" + hostID }

// StatePayload is the STATE message (Sparkplug 3.0 §6.4.1 "Host
// Application"): UTF-8 JSON {"online":..,"timestamp":<ms>}, published
// retained at QoS 1.
func StatePayload(online bool, now time.Time) []byte {
	return []byte(`{"online":` + strconv.FormatBool(online) + `,"timestamp":` + strconv.FormatInt(now.UnixMilli(), 10) + `}`)
}

// CommandTopic is the NCMD topic of an edge node.
func CommandTopic(group, node string) string { return Namespace + "/" + group + "/NCMD/" + node }

// RebirthCommand is the NCMD payload asking an edge node to rebirth:
// the metric Node Control/Rebirth, Boolean true, by name (commands are
// never aliased; Sparkplug 3.0 §6.4.1).
func RebirthCommand(now time.Time) []byte {
	ms := uint64(now.UnixMilli())
	return payload.AppendSparkplug(nil, ms, -1, []payload.SparkplugOut{
		{Name: "Node Control/Rebirth", Timestamp: ms, Datatype: payload.SpBoolean, Kind: payload.SpBoolValue, Bits: 1}})
}
