package payload

// Sparkplug B payloads (Eclipse Sparkplug 3.0, §6.4 "Payload" and §6.4.16
// "Datatypes") are protobuf messages. They are read here with a small
// decoder of the protobuf wire format (protowire) rather than generated
// code: it needs no protoc, allocates nothing per metric, and is fuzzed
// against protobuf-go's own decoder (sparkplug_test.go).
//
// The fields read, by number (proto2, all optional):
//
//	Payload: 1 timestamp (uint64, ms), 2 metrics (repeated Metric),
//	  3 seq (uint64); 4 uuid, 5 body and extensions are skipped.
//	Metric: 1 name (string), 2 alias (uint64), 3 timestamp (uint64, ms),
//	  4 datatype (uint32), 5 is_historical, 6 is_transient, 7 is_null
//	  (bool); the value is one of 10 int_value (uint32), 11 long_value
//	  (uint64), 12 float_value (float), 13 double_value (double),
//	  14 boolean_value (bool), 15 string_value, 16 bytes_value,
//	  17 dataset_value, 18 template_value, 19 extension_value. 8 metadata
//	  and 9 properties are skipped.

import (
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Sparkplug reasons: why a Sparkplug publication, or one metric of it,
// did not become a reading.
const (
	ReasonProtobuf     Reason = "invalid_protobuf"
	ReasonUnknownAlias Reason = "sparkplug_unknown_alias"
	ReasonNoBirth      Reason = "sparkplug_no_birth"
	// ReasonTooManyNodes and ReasonTooManyMetrics: an edge node over
	// sparkplug.max_nodes, a metric or device over
	// sparkplug.max_metrics_per_node.
	ReasonTooManyNodes   Reason = "sparkplug_too_many_nodes"
	ReasonTooManyMetrics Reason = "sparkplug_too_many_metrics"
	// ReasonTooManyDevices: a device over sparkplug.max_devices_per_node.
	ReasonTooManyDevices Reason = "sparkplug_too_many_devices"
	// ReasonIdentityBound: a device-role publisher speaks for an edge node
	// other than the one its identity is bound to (its first NBIRTH's).
	ReasonIdentityBound Reason = "sparkplug_identity_bound"
)

// Sparkplug datatypes (Sparkplug 3.0 §6.4.16).
const (
	SpInt8     uint32 = 1
	SpInt16    uint32 = 2
	SpInt32    uint32 = 3
	SpInt64    uint32 = 4
	SpUInt8    uint32 = 5
	SpUInt16   uint32 = 6
	SpUInt32   uint32 = 7
	SpUInt64   uint32 = 8
	SpFloat    uint32 = 9
	SpDouble   uint32 = 10
	SpBoolean  uint32 = 11
	SpString   uint32 = 12
	SpDateTime uint32 = 13
	SpText     uint32 = 14
	SpUUID     uint32 = 15
	SpDataSet  uint32 = 16
	SpBytes    uint32 = 17
	SpFile     uint32 = 18
	SpTemplate uint32 = 19
)

// SpValueKind says which field of a metric's value oneof was set.
type SpValueKind uint8

const (
	SpNoValue SpValueKind = iota
	SpIntValue
	SpLongValue
	SpFloatValue
	SpDoubleValue
	SpBoolValue
	SpStringValue
	SpBytesValue
	SpDataSetValue
	SpTemplateValue
	SpExtensionValue
)

var kindNames = [...]string{"no value", "int_value", "long_value", "float_value", "double_value", "boolean_value",
	"string_value", "bytes_value", "dataset_value", "template_value", "extension_value"}

func (k SpValueKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", k)
}

// SparkplugPayload is a decoded Sparkplug B payload. Metric names alias
// the decoded bytes.
type SparkplugPayload struct {
	Timestamp    uint64 // ms since the Unix epoch
	HasTimestamp bool
	Seq          uint64
	HasSeq       bool
	Metrics      []SparkplugMetric
}

// SparkplugMetric is one metric of a payload. Bits holds the value of the
// field Kind names: an integer or boolean as is, a float or double as its
// IEEE 754 bits; string, bytes and the rest are not kept.
type SparkplugMetric struct {
	Name                              []byte
	HasName                           bool
	Alias                             uint64
	HasAlias                          bool
	Timestamp                         uint64 // ms since the Unix epoch
	HasTimestamp                      bool
	Datatype                          uint32
	HasDatatype                       bool
	IsHistorical, IsTransient, IsNull bool
	Kind                              SpValueKind
	Bits                              uint64
}

// DecodeSparkplug decodes a Sparkplug B payload into p, reusing its
// Metrics slice. An error is an *Error with ReasonProtobuf naming the
// field that is wrong.
func DecodeSparkplug(b []byte, p *SparkplugPayload) error {
	*p = SparkplugPayload{Metrics: p.Metrics[:0]}
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protoError("payload", "field tag", n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			p.Timestamp, n = protowire.ConsumeVarint(b)
			p.HasTimestamp = true
		case num == 3 && typ == protowire.VarintType:
			p.Seq, n = protowire.ConsumeVarint(b)
			p.HasSeq = true
		case num == 2 && typ == protowire.BytesType:
			var m []byte
			m, n = protowire.ConsumeBytes(b)
			if n >= 0 {
				p.Metrics = append(p.Metrics, SparkplugMetric{})
				if err := decodeSpMetric(m, &p.Metrics[len(p.Metrics)-1], len(p.Metrics)-1); err != nil {
					return err
				}
			}
		case num <= 3:
			return &Error{Reason: ReasonProtobuf, Detail: fmt.Sprintf("payload field %d has wire type %d, which the Sparkplug B schema does not give it", num, typ)}
		default: // uuid, body, extensions
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protoError("payload", fmt.Sprintf("field %d", num), n)
		}
		b = b[n:]
	}
	return nil
}

func decodeSpMetric(b []byte, m *SparkplugMetric, idx int) error {
	where := func() string { return fmt.Sprintf("metric %d", idx) }
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protoError(where(), "field tag", n)
		}
		b = b[n:]
		var v uint64
		want := protowire.VarintType
		switch num {
		case 1, 8, 9, 15, 16, 17, 18, 19:
			want = protowire.BytesType
		case 12:
			want = protowire.Fixed32Type
		case 13:
			want = protowire.Fixed64Type
		}
		if num > 19 || num == 8 || num == 9 {
			// metadata, properties (ignored) and anything newer
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protoError(where(), fmt.Sprintf("field %d", num), n)
			}
			b = b[n:]
			continue
		}
		if typ != want {
			return &Error{Reason: ReasonProtobuf, Item: where(), Detail: fmt.Sprintf("field %d has wire type %d, the Sparkplug B schema gives it %d", num, typ, want)}
		}
		var raw []byte
		switch want {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var f uint32
			f, n = protowire.ConsumeFixed32(b)
			v = uint64(f)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		default:
			raw, n = protowire.ConsumeBytes(b)
		}
		if n < 0 {
			return protoError(where(), fmt.Sprintf("field %d", num), n)
		}
		b = b[n:]
		switch num {
		case 1:
			m.Name, m.HasName = raw, true
		case 2:
			m.Alias, m.HasAlias = v, true
		case 3:
			m.Timestamp, m.HasTimestamp = v, true
		case 4:
			m.Datatype, m.HasDatatype = uint32(v), true
		case 5:
			m.IsHistorical = v != 0
		case 6:
			m.IsTransient = v != 0
		case 7:
			m.IsNull = v != 0
		case 10:
			m.Kind, m.Bits = SpIntValue, uint64(uint32(v))
		case 11:
			m.Kind, m.Bits = SpLongValue, v
		case 12:
			m.Kind, m.Bits = SpFloatValue, v
		case 13:
			m.Kind, m.Bits = SpDoubleValue, v
		case 14:
			m.Kind, m.Bits = SpBoolValue, b2u(v != 0)
		default: // 15 to 19
			m.Kind, m.Bits = SpValueKind(int(SpStringValue)+int(num)-15), 0
		}
	}
	return nil
}

// consumeTag is protowire.ConsumeTag that also refuses field numbers
// above protowire.MaxValidNumber, as protobuf does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -2 // protowire's "invalid field number"
	}
	return num, typ, n
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func protoError(where, what string, n int) *Error {
	return &Error{Reason: ReasonProtobuf, Item: where, Detail: fmt.Sprintf("%s: %v (is this a Sparkplug B protobuf payload?)", what, protowire.ParseError(n))}
}

// SpNumeric reports whether a datatype is one edgegate aggregates: the
// integers, Float, Double, and Boolean (when booleans are taken as 0/1).
func SpNumeric(datatype uint32, booleans bool) bool {
	return datatype >= SpInt8 && datatype <= SpDouble || datatype == SpBoolean && booleans
}

// SpDatatypeName names a Sparkplug datatype for messages.
func SpDatatypeName(dt uint32) string {
	names := [...]string{"Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
		"Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes", "File", "Template", "PropertySet", "PropertySetList"}
	if int(dt) < len(names) {
		return names[dt]
	}
	if dt <= 34 {
		return "an array type"
	}
	return fmt.Sprintf("datatype %d", dt)
}

// Value returns the metric's value as a number, given its datatype (from
// the metric or its BIRTH). Signed integers are two's complement in the
// low bits of int_value or long_value, as Sparkplug 3.0 encodes them (an
// Int8 of -1 may come as 0xFF or sign-extended to 0xFFFFFFFF). Booleans
// are 0 and 1. A datatype that is not numeric, or a value field that does
// not fit it, is an *Error.
func (m *SparkplugMetric) Value(datatype uint32) (float64, *Error) {
	bad := func(format string, args ...any) (float64, *Error) {
		return 0, &Error{Reason: ReasonForm, Detail: fmt.Sprintf(format, args...)}
	}
	isInt := m.Kind == SpIntValue || m.Kind == SpLongValue
	signed := func(bits uint) (float64, *Error) {
		if !isInt {
			return bad("%s metric has %s, not int_value or long_value", SpDatatypeName(datatype), m.Kind)
		}
		lim := int64(1) << (bits - 1)
		if v := int64(m.Bits); v >= -lim && v < lim {
			return float64(v), nil
		}
		if v := int64(int32(uint32(m.Bits))); m.Bits <= math.MaxUint32 && v >= -lim && v < lim {
			return float64(v), nil // sign-extended to 32 bits
		}
		if m.Bits < uint64(1)<<bits {
			return float64(m.Bits) - float64(uint64(m.Bits)>>(bits-1)<<bits), nil // the low bits only
		}
		return 0, &Error{Reason: ReasonRange, Detail: fmt.Sprintf("%#x does not fit %s", m.Bits, SpDatatypeName(datatype))}
	}
	unsigned := func(bits uint) (float64, *Error) {
		if !isInt {
			return bad("%s metric has %s, not int_value or long_value", SpDatatypeName(datatype), m.Kind)
		}
		if bits < 64 && m.Bits >= uint64(1)<<bits {
			return 0, &Error{Reason: ReasonRange, Detail: fmt.Sprintf("%d does not fit %s", m.Bits, SpDatatypeName(datatype))}
		}
		return float64(m.Bits), nil
	}
	switch datatype {
	case SpInt8:
		return signed(8)
	case SpInt16:
		return signed(16)
	case SpInt32:
		return signed(32)
	case SpInt64:
		if !isInt {
			return bad("Int64 metric has %s, not long_value", m.Kind)
		}
		return float64(int64(m.Bits)), nil
	case SpUInt8:
		return unsigned(8)
	case SpUInt16:
		return unsigned(16)
	case SpUInt32:
		return unsigned(32)
	case SpUInt64:
		return unsigned(64)
	case SpFloat, SpDouble:
		var v float64
		switch m.Kind {
		case SpFloatValue:
			v = float64(math.Float32frombits(uint32(m.Bits)))
		case SpDoubleValue:
			v = math.Float64frombits(m.Bits)
		default:
			return bad("%s metric has %s, not float_value or double_value", SpDatatypeName(datatype), m.Kind)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, &Error{Reason: ReasonNonFinite, Detail: "NaN and infinities are not readings"}
		}
		return v, nil
	case SpBoolean:
		if m.Kind != SpBoolValue {
			return bad("Boolean metric has %s, not boolean_value", m.Kind)
		}
		return float64(m.Bits), nil
	}
	return 0, &Error{Reason: ReasonUnsupported, Detail: fmt.Sprintf("Sparkplug %s values are not aggregated", SpDatatypeName(datatype))}
}

// CheckSparkplugName checks a Sparkplug metric name as a metric name:
// Sparkplug names are folder paths ("Motor 1/Temperature"), so '/' is
// allowed; control characters, invalid UTF-8 and names over MaxNameLen
// bytes are not.
func CheckSparkplugName(name []byte) *Error {
	switch {
	case len(name) == 0:
		return &Error{Reason: ReasonName, Detail: "metric name is empty"}
	case len(name) > MaxNameLen:
		return &Error{Reason: ReasonName, Item: string(name[:32]) + "...", Detail: fmt.Sprintf("metric name is longer than %d bytes", MaxNameLen)}
	case !utf8.Valid(name):
		return &Error{Reason: ReasonName, Detail: "metric name is not valid UTF-8"}
	}
	for _, c := range name {
		if c < 0x20 || c == 0x7f {
			return &Error{Reason: ReasonName, Item: string(name), Detail: "metric name may not contain control characters"}
		}
	}
	return nil
}

// SparkplugOut is a metric to encode (AppendSparkplug).
type SparkplugOut struct {
	Name         string // empty: none (sent by alias)
	Alias        uint64
	HasAlias     bool
	Timestamp    uint64
	Datatype     uint32
	IsHistorical bool
	IsNull       bool
	Kind         SpValueKind // SpIntValue to SpBoolValue, or SpNoValue
	Bits         uint64
}

// AppendSparkplug encodes a Sparkplug B payload: the host's commands
// (NCMD Node Control/Rebirth) and tests. A zero timestamp or a negative
// seq is left out.
func AppendSparkplug(b []byte, timestamp uint64, seq int, metrics []SparkplugOut) []byte {
	if timestamp != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, timestamp)
	}
	var m []byte
	for _, x := range metrics {
		m = m[:0]
		if x.Name != "" {
			m = protowire.AppendTag(m, 1, protowire.BytesType)
			m = protowire.AppendString(m, x.Name)
		}
		if x.HasAlias {
			m = protowire.AppendTag(m, 2, protowire.VarintType)
			m = protowire.AppendVarint(m, x.Alias)
		}
		if x.Timestamp != 0 {
			m = protowire.AppendTag(m, 3, protowire.VarintType)
			m = protowire.AppendVarint(m, x.Timestamp)
		}
		if x.Datatype != 0 {
			m = protowire.AppendTag(m, 4, protowire.VarintType)
			m = protowire.AppendVarint(m, uint64(x.Datatype))
		}
		if x.IsHistorical {
			m = protowire.AppendTag(m, 5, protowire.VarintType)
			m = protowire.AppendVarint(m, 1)
		}
		if x.IsNull {
			m = protowire.AppendTag(m, 7, protowire.VarintType)
			m = protowire.AppendVarint(m, 1)
		}
		switch x.Kind {
		case SpIntValue:
			m = protowire.AppendTag(m, 10, protowire.VarintType)
			m = protowire.AppendVarint(m, uint64(uint32(x.Bits)))
		case SpLongValue:
			m = protowire.AppendTag(m, 11, protowire.VarintType)
			m = protowire.AppendVarint(m, x.Bits)
		case SpFloatValue:
			m = protowire.AppendTag(m, 12, protowire.Fixed32Type)
			m = protowire.AppendFixed32(m, uint32(x.Bits))
		case SpDoubleValue:
			m = protowire.AppendTag(m, 13, protowire.Fixed64Type)
			m = protowire.AppendFixed64(m, x.Bits)
		case SpBoolValue:
			m = protowire.AppendTag(m, 14, protowire.VarintType)
			m = protowire.AppendVarint(m, x.Bits&1)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	if seq >= 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(seq))
	}
	return b
}
