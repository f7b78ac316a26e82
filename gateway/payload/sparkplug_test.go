package payload

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// reference builds, with protobuf-go, the messages Payload and Metric of
// the Sparkplug B schema as far as the decoder reads them (field numbers
// and types of Sparkplug 3.0 §6.4), so that the hand-written decoder is
// checked against protobuf's own. Message-typed fields the decoder skips
// (metadata, properties, dataset, template, extension) are bytes here:
// the decoder does not look inside them, and neither does this.
func reference(t testing.TB) (payload, metric protoreflect.MessageDescriptor) {
	t.Helper()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
	rep := descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, label descriptorpb.FieldDescriptorProto_Label, oneof bool) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(), Label: label.Enum()}
		if oneof {
			f.OneofIndex = proto.Int32(0)
		}
		return f
	}
	T := descriptorpb.FieldDescriptorProto_TYPE_UINT64
	metricMsg := &descriptorpb.DescriptorProto{
		Name: proto.String("Metric"),
		Field: []*descriptorpb.FieldDescriptorProto{
			field("name", 1, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, false),
			field("alias", 2, T, opt, false),
			field("timestamp", 3, T, opt, false),
			field("datatype", 4, descriptorpb.FieldDescriptorProto_TYPE_UINT32, opt, false),
			field("is_historical", 5, descriptorpb.FieldDescriptorProto_TYPE_BOOL, opt, false),
			field("is_transient", 6, descriptorpb.FieldDescriptorProto_TYPE_BOOL, opt, false),
			field("is_null", 7, descriptorpb.FieldDescriptorProto_TYPE_BOOL, opt, false),
			field("metadata", 8, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, false),
			field("properties", 9, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, false),
			field("int_value", 10, descriptorpb.FieldDescriptorProto_TYPE_UINT32, opt, true),
			field("long_value", 11, T, opt, true),
			field("float_value", 12, descriptorpb.FieldDescriptorProto_TYPE_FLOAT, opt, true),
			field("double_value", 13, descriptorpb.FieldDescriptorProto_TYPE_DOUBLE, opt, true),
			field("boolean_value", 14, descriptorpb.FieldDescriptorProto_TYPE_BOOL, opt, true),
			field("string_value", 15, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, true),
			field("bytes_value", 16, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, true),
			field("dataset_value", 17, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, true),
			field("template_value", 18, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, true),
			field("extension_value", 19, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, true),
		},
		OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("value")}},
	}
	payloadMsg := &descriptorpb.DescriptorProto{
		Name: proto.String("Payload"),
		Field: []*descriptorpb.FieldDescriptorProto{
			field("timestamp", 1, T, opt, false),
			{Name: proto.String("metrics"), Number: proto.Int32(2), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), Label: rep.Enum(), TypeName: proto.String(".spb.Metric")},
			field("seq", 3, T, opt, false),
			field("uuid", 4, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, false),
			field("body", 5, descriptorpb.FieldDescriptorProto_TYPE_BYTES, opt, false),
		},
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{Name: proto.String("spb.proto"), Package: proto.String("spb"), Syntax: proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{payloadMsg, metricMsg}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("Payload"), fd.Messages().ByName("Metric")
}

// fromReference reads a protobuf-go message into the decoder's form.
func fromReference(msg protoreflect.Message) SparkplugPayload {
	var p SparkplugPayload
	fs := msg.Descriptor().Fields()
	get := func(m protoreflect.Message, name string) (protoreflect.Value, bool) {
		f := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		return m.Get(f), m.Has(f)
	}
	if v, ok := get(msg, "timestamp"); ok {
		p.Timestamp, p.HasTimestamp = v.Uint(), true
	}
	if v, ok := get(msg, "seq"); ok {
		p.Seq, p.HasSeq = v.Uint(), true
	}
	list := msg.Get(fs.ByName("metrics")).List()
	for i := 0; i < list.Len(); i++ {
		m := list.Get(i).Message()
		var x SparkplugMetric
		if v, ok := get(m, "name"); ok {
			x.Name, x.HasName = v.Bytes(), true
		}
		if v, ok := get(m, "alias"); ok {
			x.Alias, x.HasAlias = v.Uint(), true
		}
		if v, ok := get(m, "timestamp"); ok {
			x.Timestamp, x.HasTimestamp = v.Uint(), true
		}
		if v, ok := get(m, "datatype"); ok {
			x.Datatype, x.HasDatatype = uint32(v.Uint()), true
		}
		v, _ := get(m, "is_historical")
		x.IsHistorical = v.Bool()
		v, _ = get(m, "is_transient")
		x.IsTransient = v.Bool()
		v, _ = get(m, "is_null")
		x.IsNull = v.Bool()
		if f := m.WhichOneof(m.Descriptor().Oneofs().ByName("value")); f != nil {
			v := m.Get(f)
			switch f.Number() {
			case 10:
				x.Kind, x.Bits = SpIntValue, v.Uint()
			case 11:
				x.Kind, x.Bits = SpLongValue, v.Uint()
			case 12:
				x.Kind, x.Bits = SpFloatValue, uint64(math.Float32bits(float32(v.Float())))
			case 13:
				x.Kind, x.Bits = SpDoubleValue, math.Float64bits(v.Float())
			case 14:
				x.Kind, x.Bits = SpBoolValue, b2u(v.Bool())
			default:
				x.Kind = SpValueKind(int(SpStringValue) + int(f.Number()) - 15)
			}
		}
		p.Metrics = append(p.Metrics, x)
	}
	return p
}

func isNaN32(bits uint64) bool { return math.IsNaN(float64(math.Float32frombits(uint32(bits)))) }

func samePayload(a, b SparkplugPayload) bool {
	if a.Timestamp != b.Timestamp || a.HasTimestamp != b.HasTimestamp || a.Seq != b.Seq || a.HasSeq != b.HasSeq || len(a.Metrics) != len(b.Metrics) {
		return false
	}
	for i := range a.Metrics {
		x, y := a.Metrics[i], b.Metrics[i]
		if !bytes.Equal(x.Name, y.Name) {
			return false
		}
		x.Name, y.Name = nil, nil
		// A float NaN is NaN whatever its payload bits: protobuf-go's
		// value passes through a float64, which sets a signalling NaN's
		// quiet bit, where the decoder keeps the bits it read (and the
		// gateway refuses NaN either way).
		if x.Kind == SpFloatValue && y.Kind == SpFloatValue && isNaN32(x.Bits) && isNaN32(y.Bits) {
			y.Bits = x.Bits
		}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// TestSparkplugAgainstProtobuf encodes payloads with protobuf-go and
// checks that the decoder reads the same fields.
func TestSparkplugAgainstProtobuf(t *testing.T) {
	pd, md := reference(t)
	p := dynamicpb.NewMessage(pd)
	set := func(m *dynamicpb.Message, name string, v protoreflect.Value) {
		m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(name)), v)
	}
	set(p, "timestamp", protoreflect.ValueOfUint64(1796032800123))
	set(p, "seq", protoreflect.ValueOfUint64(255))
	set(p, "uuid", protoreflect.ValueOfBytes([]byte("ignored")))
	list := p.Mutable(pd.Fields().ByName("metrics")).List()
	add := func(fill func(m *dynamicpb.Message)) {
		m := dynamicpb.NewMessage(md)
		fill(m)
		list.Append(protoreflect.ValueOfMessage(m))
	}
	add(func(m *dynamicpb.Message) {
		set(m, "name", protoreflect.ValueOfBytes([]byte("Motor/Temperature")))
		set(m, "alias", protoreflect.ValueOfUint64(7))
		set(m, "timestamp", protoreflect.ValueOfUint64(1796032800000))
		set(m, "datatype", protoreflect.ValueOfUint32(SpDouble))
		set(m, "properties", protoreflect.ValueOfBytes([]byte{0x0a, 0x01, 'x'}))
		set(m, "double_value", protoreflect.ValueOfFloat64(21.5))
	})
	add(func(m *dynamicpb.Message) {
		set(m, "alias", protoreflect.ValueOfUint64(8))
		set(m, "is_historical", protoreflect.ValueOfBool(true))
		set(m, "int_value", protoreflect.ValueOfUint32(0xFFFFFFFB))
	})
	add(func(m *dynamicpb.Message) {
		set(m, "alias", protoreflect.ValueOfUint64(9))
		set(m, "is_null", protoreflect.ValueOfBool(true))
		set(m, "is_transient", protoreflect.ValueOfBool(true))
	})
	add(func(m *dynamicpb.Message) {
		set(m, "name", protoreflect.ValueOfBytes([]byte("table")))
		set(m, "dataset_value", protoreflect.ValueOfBytes([]byte{0x08, 0x02}))
	})
	add(func(m *dynamicpb.Message) {
		set(m, "float_value", protoreflect.ValueOfFloat32(-1.25))
		set(m, "boolean_value", protoreflect.ValueOfBool(true)) // a later oneof field wins
	})
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var got SparkplugPayload
	if err := DecodeSparkplug(b, &got); err != nil {
		t.Fatal(err)
	}
	want := fromReference(p)
	if !samePayload(got, want) {
		t.Fatalf("decoded\n%+v\nprotobuf-go says\n%+v", got, want)
	}
	if len(got.Metrics) != 5 || got.Metrics[3].Kind != SpDataSetValue || got.Metrics[4].Kind != SpBoolValue || string(got.Metrics[0].Name) != "Motor/Temperature" {
		t.Fatalf("unexpected metrics %+v", got.Metrics)
	}
	if v, e := got.Metrics[1].Value(SpInt32); e != nil || v != -5 {
		t.Fatalf("Int32 0xFFFFFFFB = %v, %v; want -5", v, e)
	}
	if n := testing.AllocsPerRun(100, func() { _ = DecodeSparkplug(b, &got) }); n != 0 {
		t.Errorf("DecodeSparkplug allocates %v times per payload once its slice has room", n)
	}
}

func TestSparkplugRoundTrip(t *testing.T) {
	in := []SparkplugOut{
		{Name: "Node Control/Rebirth", Datatype: SpBoolean, Kind: SpBoolValue, Bits: 1},
		{Alias: 3, HasAlias: true, Timestamp: 1796032800500, IsHistorical: true, Kind: SpLongValue, Bits: math.MaxUint64},
		{Alias: 0, HasAlias: true, Kind: SpFloatValue, Bits: uint64(math.Float32bits(2.5))},
		{Name: "n", IsNull: true, Datatype: SpInt16},
	}
	b := AppendSparkplug(nil, 1796032800999, 0, in)
	var p SparkplugPayload
	if err := DecodeSparkplug(b, &p); err != nil {
		t.Fatal(err)
	}
	if !p.HasTimestamp || p.Timestamp != 1796032800999 || !p.HasSeq || p.Seq != 0 || len(p.Metrics) != len(in) {
		t.Fatalf("header %+v", p)
	}
	for i, x := range in {
		m := p.Metrics[i]
		if string(m.Name) != x.Name || m.HasName != (x.Name != "") || m.Alias != x.Alias || m.HasAlias != x.HasAlias || m.Timestamp != x.Timestamp ||
			m.Datatype != x.Datatype || m.IsHistorical != x.IsHistorical || m.IsNull != x.IsNull || m.Kind != x.Kind || m.Bits != x.Bits {
			t.Errorf("metric %d: %+v, sent %+v", i, m, x)
		}
	}
	if b := AppendSparkplug(nil, 0, -1, nil); len(b) != 0 {
		t.Errorf("empty payload encodes as %x", b)
	}
}

func TestSparkplugValue(t *testing.T) {
	f32 := func(f float32) SparkplugMetric {
		return SparkplugMetric{Kind: SpFloatValue, Bits: uint64(math.Float32bits(f))}
	}
	i := func(v uint64) SparkplugMetric { return SparkplugMetric{Kind: SpIntValue, Bits: v} }
	l := func(v uint64) SparkplugMetric { return SparkplugMetric{Kind: SpLongValue, Bits: v} }
	neg := func(v int64) uint64 { return uint64(v) }
	tests := map[string]struct {
		m    SparkplugMetric
		dt   uint32
		want float64
		err  Reason
	}{
		"Int8 positive":                {m: i(127), dt: SpInt8, want: 127},
		"Int8 -1 as 0xFF":              {m: i(0xFF), dt: SpInt8, want: -1},
		"Int8 -1 sign-extended":        {m: i(0xFFFFFFFF), dt: SpInt8, want: -1},
		"Int8 -128 as 0x80":            {m: i(0x80), dt: SpInt8, want: -128},
		"Int8 out of range":            {m: i(0x1FF), dt: SpInt8, err: ReasonRange},
		"Int16 -300":                   {m: i(uint64(uint32(0xFFFFFED4))), dt: SpInt16, want: -300},
		"Int16 -2 as 0xFFFE":           {m: i(0xFFFE), dt: SpInt16, want: -2},
		"Int32 min":                    {m: i(0x80000000), dt: SpInt32, want: math.MinInt32},
		"Int32 in long_value":          {m: l(neg(-7)), dt: SpInt32, want: -7},
		"Int64 negative":               {m: l(neg(-1234567890123)), dt: SpInt64, want: -1234567890123},
		"UInt8 255":                    {m: i(255), dt: SpUInt8, want: 255},
		"UInt8 256":                    {m: i(256), dt: SpUInt8, err: ReasonRange},
		"UInt16 65535":                 {m: i(65535), dt: SpUInt16, want: 65535},
		"UInt32 max":                   {m: i(math.MaxUint32), dt: SpUInt32, want: math.MaxUint32},
		"UInt64 max":                   {m: l(math.MaxUint64), dt: SpUInt64, want: math.MaxUint64},
		"UInt64 in int_value":          {m: i(42), dt: SpUInt64, want: 42},
		"Float":                        {m: f32(21.5), dt: SpFloat, want: 21.5},
		"Double":                       {m: SparkplugMetric{Kind: SpDoubleValue, Bits: math.Float64bits(-0.125)}, dt: SpDouble, want: -0.125},
		"Double NaN":                   {m: SparkplugMetric{Kind: SpDoubleValue, Bits: math.Float64bits(math.NaN())}, dt: SpDouble, err: ReasonNonFinite},
		"Float infinity":               {m: f32(float32(math.Inf(1))), dt: SpFloat, err: ReasonNonFinite},
		"Boolean true":                 {m: SparkplugMetric{Kind: SpBoolValue, Bits: 1}, dt: SpBoolean, want: 1},
		"Boolean false":                {m: SparkplugMetric{Kind: SpBoolValue}, dt: SpBoolean, want: 0},
		"Int32 with a double":          {m: SparkplugMetric{Kind: SpDoubleValue}, dt: SpInt32, err: ReasonForm},
		"Double with an int":           {m: i(1), dt: SpDouble, err: ReasonForm},
		"Boolean with an int":          {m: i(1), dt: SpBoolean, err: ReasonForm},
		"String is not aggregated":     {m: SparkplugMetric{Kind: SpStringValue}, dt: SpString, err: ReasonUnsupported},
		"DataSet is not aggregated":    {m: SparkplugMetric{Kind: SpDataSetValue}, dt: SpDataSet, err: ReasonUnsupported},
		"Template is not aggregated":   {m: SparkplugMetric{Kind: SpTemplateValue}, dt: SpTemplate, err: ReasonUnsupported},
		"DateTime is not aggregated":   {m: l(1796032800000), dt: SpDateTime, err: ReasonUnsupported},
		"an array is not aggregated":   {m: SparkplugMetric{Kind: SpBytesValue}, dt: 22, err: ReasonUnsupported},
		"unknown datatype":             {m: i(1), dt: 0, err: ReasonUnsupported},
		"Int64 with no value field":    {m: SparkplugMetric{}, dt: SpInt64, err: ReasonForm},
		"UInt32 with a long too large": {m: l(1 << 33), dt: SpUInt32, err: ReasonRange},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tc.m.Value(tc.dt)
			if tc.err != "" {
				if err == nil || err.Reason != tc.err {
					t.Fatalf("Value = %v, %v; want reason %s", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Value = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestDecodeSparkplugErrors(t *testing.T) {
	good := AppendSparkplug(nil, 1, 1, []SparkplugOut{{Name: "a", Datatype: SpDouble, Kind: SpDoubleValue}})
	tests := map[string][]byte{
		"truncated":               good[:len(good)-1],
		"truncated metric":        good[:5],
		"seq as bytes":            {0x1a, 0x01, 0x00},
		"metric as varint":        {0x10, 0x01},
		"name as varint":          {0x12, 0x02, 0x08, 0x01},
		"double as varint":        {0x12, 0x02, 0x68, 0x01},
		"field number 0":          {0x00, 0x01},
		"varint overflow":         {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"metric length past end":  {0x12, 0x7f, 0x08},
		"not protobuf (JSON)":     []byte(`{"v":1}`),
		"unknown field truncated": {0x32, 0x05, 0x01},
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			var p SparkplugPayload
			err := DecodeSparkplug(b, &p)
			var e *Error
			if !errors.As(err, &e) || e.Reason != ReasonProtobuf {
				t.Fatalf("DecodeSparkplug(%x) = %v, want %s", b, err, ReasonProtobuf)
			}
		})
	}
}

// FuzzSparkplug checks the decoder against protobuf-go on any input: what
// protobuf-go refuses the decoder refuses, and what the decoder accepts it
// reads as protobuf-go does. (The decoder is stricter: a known field with
// another wire type is an error, where protobuf keeps it as unknown.)
func FuzzSparkplug(f *testing.F) {
	f.Add(AppendSparkplug(nil, 1796032800123, 0, []SparkplugOut{
		{Name: "bdSeq", Datatype: SpInt64, Kind: SpLongValue, Bits: 3},
		{Name: "Motor/Temperature", Alias: 1, HasAlias: true, Datatype: SpDouble, Kind: SpDoubleValue, Bits: math.Float64bits(21.5)},
		{Name: "rpm", Alias: 2, HasAlias: true, Datatype: SpInt16, Kind: SpIntValue, Bits: 0xFFFF},
	}))
	f.Add(AppendSparkplug(nil, 1796032800123, 17, []SparkplugOut{
		{Alias: 1, HasAlias: true, Timestamp: 1796032700000, IsHistorical: true, Kind: SpDoubleValue, Bits: math.Float64bits(20)},
		{Alias: 2, HasAlias: true, IsNull: true},
	}))
	f.Add([]byte{0x12, 0x04, 0x7a, 0x02, 'h', 'i'})         // a string value
	f.Add([]byte{0x12, 0x03, 0x8a, 0x01, 0x00})             // an empty dataset
	f.Add([]byte{0x12, 0x05, 0x65, 0x00, 0x00, 0xc0, 0x3f}) // float 1.5
	f.Add([]byte{0x2a, 0x00, 0x33, 0x34, 0x08, 0x01})       // body, then a group
	pd, _ := reference(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var got SparkplugPayload
		err := DecodeSparkplug(b, &got)
		ref := dynamicpb.NewMessage(pd)
		rerr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, ref)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Reason != ReasonProtobuf {
				t.Fatalf("error %v is not an *Error with %s", err, ReasonProtobuf)
			}
			return
		}
		if rerr != nil {
			t.Fatalf("decoded %x, which protobuf-go refuses: %v", b, rerr)
		}
		if want := fromReference(ref); !samePayload(got, want) {
			t.Fatalf("%x decoded as\n%+v\nprotobuf-go says\n%+v", b, got, want)
		}
		for i := range got.Metrics {
			if v, e := got.Metrics[i].Value(got.Metrics[i].Datatype); e == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
				t.Fatalf("metric %d: value %v", i, v)
			}
		}
	})
}
