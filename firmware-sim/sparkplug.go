package firmwaresim

import (
	"bytes"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Sparkplug B edge nodes (FormSparkplug). A device of this form is an
// edge node whose id is the device's, in group Device.Prefix (default
// "sim"), with one Sparkplug device, "sensor", carrying the metrics: its
// readings are the gateway's device <group>/<id>/sensor. Its firmware does
// what Sparkplug 3.0 asks of an edge node:
//
//   - each connection is a session: the will is an NDEATH with the
//     session's bdSeq (one more each connection), and before anything else
//     it publishes an NBIRTH (seq 0, bdSeq, Node Control/Rebirth) and a
//     DBIRTH defining every metric with an alias (null values: births
//     carry no reading);
//   - readings go out as DDATA by alias, seq one more each message
//     (wrapping at 256), QoS Device.QoS, at the reading's own timestamp;
//     those taken while offline are sent with is_historical;
//   - going offline it publishes its NDEATH, then disconnects;
//   - with Behaviour.AliasLossProb, a sample may renumber its aliases
//     without a rebirth (a firmware bug): the gateway cannot resolve its
//     DDATA (truth kind alias_lost, not counted) until it asks for a
//     rebirth (NCMD Node Control/Rebirth), which the node answers with new
//     births.
//
// The payloads are encoded here with protowire, independently of the
// gateway's decoder.

// KindAliasLost is a reading sent by an alias the gateway does not know:
// the gateway dead-letters it.
const KindAliasLost = "alias_lost"

// SparkplugDevice is the Sparkplug device id under each simulated edge
// node.
const SparkplugDevice = "sensor"

// Sparkplug datatypes used.
const (
	spInt64   = 4
	spUInt64  = 8
	spDouble  = 10
	spBoolean = 11
)

// spState is a Sparkplug edge node's session state.
type spState struct {
	group     string
	bdSeq     uint64
	seq       int
	born      bool   // the gateway knows the current aliases
	aliasBase uint64 // aliases are aliasBase + 1 + metric index
	rebirth   chan struct{}
	births    []outMsg // to send before anything else
}

func newSpState(d Device) *spState {
	g := d.Prefix
	if g == "" {
		g = "sim"
	}
	return &spState{group: g, rebirth: make(chan struct{}, 1)}
}

func (s *spState) topic(typ, node string) string {
	t := "spBv1.0/" + s.group + "/" + typ + "/" + node
	if typ[0] == 'D' {
		t += "/" + SparkplugDevice
	}
	return t
}

// deviceName is the gateway's device of the node's readings.
func (s *spState) deviceName(node string) string { return s.group + "/" + node + "/" + SparkplugDevice }

// death is the NDEATH of the current session (the will).
func (s *spState) death(node string) Message {
	var m []byte
	m = spMetric(m, "bdSeq", 0, false, 0, spUInt64, false, false, s.bdSeq)
	return Message{Topic: s.topic("NDEATH", node), Payload: spPayload(nil, 0, -1, m)}
}

func (s *spState) queueBirths() {
	s.births = []outMsg{{Message: Message{Topic: "NBIRTH"}}, {Message: Message{Topic: "DBIRTH"}}}
}

// encodeBirth encodes the birth om stands for, with the next seq.
func (s *spState) encodeBirth(om *outMsg, node string, metrics []Metric, now time.Time) {
	ms := uint64(now.UnixMilli())
	var body []byte
	if om.Topic == "NBIRTH" {
		s.seq = 0
		body = spMetric(body, "bdSeq", 0, false, ms, spUInt64, false, false, s.bdSeq)
		body = spMetric(body, "Node Control/Rebirth", 0, false, ms, spBoolean, false, false, 0)
		om.Topic = s.topic("NBIRTH", node)
	} else {
		for i, m := range metrics {
			body = spMetric(body, m.Name, s.aliasBase+1+uint64(i), true, ms, spDouble, false, true, 0)
		}
		om.Topic = s.topic("DBIRTH", node)
		s.born = true
	}
	om.Payload = spPayload(nil, ms, s.next(), body)
}

// next returns the seq of the next message.
func (s *spState) next() int {
	n := s.seq
	s.seq = (s.seq + 1) % 256
	return n
}

// encodeData encodes a DDATA of the readings in om.sent, by alias, with
// the next seq, and marks them alias_lost if the gateway cannot resolve
// them.
func (s *spState) encodeData(om *outMsg, metrics []Metric) {
	var body []byte
	for i := range om.sent {
		x := &om.sent[i]
		idx := 0
		for j, m := range metrics {
			if m.Name == x.Metric {
				idx = j
			}
		}
		body = spMetric(body, "", s.aliasBase+1+uint64(idx), true, uint64(x.Time.UnixMilli()), 0, om.historical, false, math.Float64bits(x.Value))
		switch {
		case !s.born:
			x.Kind = KindAliasLost
		case x.Kind == KindAliasLost: // sent again once born
			x.Kind = KindReading
		}
	}
	om.Payload = spPayload(nil, uint64(om.sent[0].Time.UnixMilli()), s.next(), body)
}

// loseAliases renumbers the aliases without telling the gateway.
func (s *spState) loseAliases() {
	s.aliasBase += 100
	s.born = false
}

// isRebirth reports whether an NCMD asks for a rebirth.
func isRebirth(payload []byte) bool { return bytes.Contains(payload, []byte("Node Control/Rebirth")) }

// spMetric appends a Metric message (field 2 of Payload). A zero datatype
// is left out (DATA messages need none); null births have no value. The
// value is a double (datatype Double or none), a boolean or an unsigned
// long, by datatype.
func spMetric(b []byte, name string, alias uint64, hasAlias bool, ts uint64, datatype uint32, historical, null bool, bits uint64) []byte {
	var m []byte
	if name != "" {
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, name)
	}
	if hasAlias {
		m = protowire.AppendTag(m, 2, protowire.VarintType)
		m = protowire.AppendVarint(m, alias)
	}
	if ts != 0 {
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, ts)
	}
	if datatype != 0 {
		m = protowire.AppendTag(m, 4, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(datatype))
	}
	if historical {
		m = protowire.AppendTag(m, 5, protowire.VarintType)
		m = protowire.AppendVarint(m, 1)
	}
	switch {
	case null:
		m = protowire.AppendTag(m, 7, protowire.VarintType)
		m = protowire.AppendVarint(m, 1)
	case datatype == spBoolean:
		m = protowire.AppendTag(m, 14, protowire.VarintType)
		m = protowire.AppendVarint(m, bits)
	case datatype == spInt64 || datatype == spUInt64:
		m = protowire.AppendTag(m, 11, protowire.VarintType)
		m = protowire.AppendVarint(m, bits)
	default:
		m = protowire.AppendTag(m, 13, protowire.Fixed64Type)
		m = protowire.AppendFixed64(m, bits)
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// spPayload wraps encoded metrics in a Payload: timestamp (if not 0),
// metrics, seq (if not negative).
func spPayload(b []byte, ts uint64, seq int, metrics []byte) []byte {
	if ts != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, ts)
	}
	b = append(b, metrics...)
	if seq >= 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(seq))
	}
	return b
}
