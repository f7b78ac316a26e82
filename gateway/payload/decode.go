package payload

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/edgegate/edgegate/aggregate"
)

// Reason is the stable name of why a payload, or one item of it, was
// refused. It is the dead-letter reason and a metric label.
type Reason string

const (
	ReasonEmpty       Reason = "empty_payload"
	ReasonTooLarge    Reason = "payload_too_large"
	ReasonInvalidJSON Reason = "invalid_json"
	ReasonNotNumber   Reason = "not_a_number"
	ReasonNonFinite   Reason = "non_finite"
	ReasonRange       Reason = "number_out_of_range"
	ReasonTimestamp   Reason = "bad_timestamp"
	ReasonUnsupported Reason = "unsupported_value"
	ReasonNoValue     Reason = "missing_value"
	ReasonName        Reason = "bad_name"
	ReasonForm        Reason = "wrong_form"
)

// AllReasons lists every Reason, for counters and metrics.
var AllReasons = [...]Reason{
	ReasonEmpty, ReasonTooLarge, ReasonInvalidJSON, ReasonNotNumber, ReasonNonFinite, ReasonRange,
	ReasonTimestamp, ReasonUnsupported, ReasonNoValue, ReasonName, ReasonForm,
	ReasonProtobuf, ReasonUnknownAlias, ReasonNoBirth, ReasonTooManyNodes, ReasonTooManyMetrics,
	ReasonTooManyDevices, ReasonIdentityBound,
}

// Error says why a payload, or one item of it, could not become a reading.
type Error struct {
	Reason Reason
	Item   string // the metric, JSON key or SenML record the error is about; may be empty
	Detail string
}

func (e *Error) Error() string {
	if e.Item != "" {
		return fmt.Sprintf("%s: %s: %s", e.Reason, e.Item, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Reason, e.Detail)
}

// Handler receives what a payload decodes to. Reading is called once per
// reading, in payload order; Reject once per item that was refused while the
// rest of the payload went on (a non-numeric field of an object, a SenML
// record with a string value).
type Handler interface {
	Reading(r aggregate.Reading)
	Reject(err *Error)
}

// Counter may be implemented by a Handler that keeps the details of only
// so many refused items. Before it describes a refused item of an object
// or a SenML pack, the decoder asks Counted: true means the handler has
// counted the refusal for reason and wants no description, so the
// decoder makes none (a pack of 20,000 bad records then costs a count
// each, not an error message each).
type Counter interface {
	Counted(reason Reason) bool
}

// errCounted is what resolveSenML returns for a refusal the Counter
// counted: nothing to hand on.
var errCounted = &Error{}

// counter returns h's Counter, or nil.
func counter(h Handler) Counter {
	c, _ := h.(Counter)
	return c
}

// counted reports whether c counted a refusal for reason.
func counted(c Counter, reason Reason) bool { return c != nil && c.Counted(reason) }

// DefaultMaxPayload is the largest payload decoded by default.
const DefaultMaxPayload = 64 << 10

// MaxNameLen bounds device and metric names, in bytes.
const MaxNameLen = 128

// Decoder matches topics and decodes payloads. It is safe for concurrent use.
type Decoder struct {
	patterns   []*Pattern
	maxPayload int
}

// NewDecoder compiles the topic patterns, tried in order. maxPayload <= 0
// means DefaultMaxPayload.
func NewDecoder(patterns []string, maxPayload int) (*Decoder, error) {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	d := &Decoder{maxPayload: maxPayload}
	for _, text := range patterns {
		p, err := CompilePattern(text)
		if err != nil {
			return nil, err
		}
		d.patterns = append(d.patterns, p)
	}
	return d, nil
}

// Patterns returns the compiled patterns.
func (d *Decoder) Patterns() []*Pattern { return d.patterns }

// Decode decodes one publication. It returns matched false, and does
// nothing, when the topic matches no pattern: such traffic is not a reading.
// A payload that cannot be decoded at all returns an *Error; items refused
// individually go to h.Reject. now is the arrival time, used for readings
// without a timestamp and for SenML relative times: those readings have
// Timing aggregate.GatewayTime, the others aggregate.DeviceTime.
func (d *Decoder) Decode(topic string, payload []byte, now time.Time, h Handler) (matched bool, err error) {
	for _, p := range d.patterns {
		device, metric, ok := p.Match(topic)
		if !ok {
			continue
		}
		if len(payload) > d.maxPayload {
			return true, &Error{Reason: ReasonTooLarge, Detail: fmt.Sprintf("%d bytes, the limit is %d", len(payload), d.maxPayload)}
		}
		if p.metric >= 0 {
			return true, decodeMetric(device, metric, payload, now, h)
		}
		return true, decodeDevice(device, payload, now, h)
	}
	return false, nil
}

// decodeMetric decodes the payload of a topic that names the metric: a bare
// number or {"v": .., "t": .., "u": ..}.
func decodeMetric(device, metric string, payload []byte, now time.Time, h Handler) error {
	if err := checkName("device", device); err != nil {
		return err
	}
	if err := checkName("metric", metric); err != nil {
		return err
	}
	b := trimJSONSpace(payload)
	if len(b) == 0 {
		return &Error{Reason: ReasonEmpty, Detail: "no value in payload"}
	}
	if b[0] != '{' {
		v, err := bareNumber(b)
		if err != nil {
			return err
		}
		h.Reading(aggregate.Reading{Device: device, Metric: metric, Time: now, Value: v, Timing: aggregate.GatewayTime})
		return nil
	}
	s := scanner{b: b}
	r := aggregate.Reading{Device: device, Metric: metric, Time: now, Timing: aggregate.GatewayTime}
	haveV := false
	var itemErr *Error
	err := s.objectFields(func(key []byte, _ bool) error {
		switch string(key) {
		case "v":
			if s.kind() != kindNumber {
				itemErr = &Error{Reason: ReasonUnsupported, Item: metric, Detail: `"v" must be a number`}
				return s.skip(0)
			}
			v, err := s.number()
			if err != nil {
				itemErr = rangeError(metric, nil)
				return nil
			}
			r.Value, haveV = v, true
		case "t":
			t, err := s.timestamp(now)
			if err != nil {
				if e, ok := err.(*Error); ok {
					itemErr = e
					return nil
				}
				return err
			}
			r.Time, r.Timing = t, aggregate.DeviceTime
		case "u":
			if s.kind() != kindString {
				itemErr = &Error{Reason: ReasonUnsupported, Item: metric, Detail: `"u" must be a string`}
				return s.skip(0)
			}
			u, err := s.str()
			if err != nil {
				return err
			}
			r.Unit = u
		default:
			return s.skip(0) // unknown keys are ignored, for forward compatibility
		}
		return nil
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return jsonError(err)
	}
	if itemErr != nil {
		return itemErr
	}
	if !haveV {
		return &Error{Reason: ReasonNoValue, Item: metric, Detail: `object has no "v"`}
	}
	h.Reading(r)
	return nil
}

// decodeDevice decodes the payload of a topic that names only the device: a
// JSON object of metrics, or a SenML pack.
func decodeDevice(device string, payload []byte, now time.Time, h Handler) error {
	b := trimJSONSpace(payload)
	if len(b) == 0 {
		return &Error{Reason: ReasonEmpty, Detail: "no value in payload"}
	}
	switch b[0] {
	case '{':
		if err := checkName("device", device); err != nil {
			return err
		}
		return decodeObject(device, b, now, h)
	case '[':
		return decodeSenML(device, b, now, h)
	}
	if _, err := bareNumber(b); err == nil {
		return &Error{Reason: ReasonForm, Detail: "a bare number needs a topic that names the metric (e.g. sensors/{device}/{metric}); here send a JSON object or a SenML pack"}
	}
	return &Error{Reason: ReasonInvalidJSON, Detail: "expected a JSON object of metrics or a SenML pack"}
}

// decodeObject decodes {"t": .., "temp_c": 21.5, "rh": 40}.
func decodeObject(device string, b []byte, now time.Time, h Handler) error {
	// First pass: validate the whole object and find "t", which may come
	// after the metrics.
	t, timing := now, aggregate.GatewayTime
	s := scanner{b: b}
	err := s.objectFields(func(key []byte, esc bool) error {
		if !esc && string(key) == "t" {
			ts, err := s.timestamp(now)
			if err != nil {
				return err
			}
			t, timing = ts, aggregate.DeviceTime
			return nil
		}
		return s.skip(0)
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return e
		}
		return jsonError(err)
	}
	s = scanner{b: b}
	cnt := counter(h)
	return s.objectFields(func(key []byte, esc bool) error {
		if !esc && string(key) == "t" {
			return s.skip(0)
		}
		if !esc && cnt != nil {
			// Refused and counted: not even the name is copied.
			reason := Reason("")
			switch {
			case !validKey(key):
				reason = ReasonName
			case s.kind() != kindNumber:
				reason = ReasonUnsupported
			}
			if reason != "" && cnt.Counted(reason) {
				return s.skip(0)
			}
		}
		name, err := keyString(key, esc)
		if err != nil {
			return err
		}
		if e := checkName("metric", name); e != nil {
			h.Reject(e)
			return s.skip(0)
		}
		if s.kind() != kindNumber {
			h.Reject(&Error{Reason: ReasonUnsupported, Item: name, Detail: "value is not a number"})
			return s.skip(0)
		}
		v, err := s.number()
		if err != nil {
			if !counted(cnt, ReasonRange) {
				h.Reject(rangeError(name, nil))
			}
			return nil
		}
		h.Reading(aggregate.Reading{Device: device, Metric: name, Time: t, Value: v, Timing: timing})
		return nil
	})
}

func keyString(key []byte, esc bool) (string, error) {
	if !esc {
		return string(key), nil
	}
	return unquote(key)
}

// senmlRecord holds one SenML record's fields (RFC 8428 §4.1, §4.2).
type senmlRecord struct {
	bn, bu, n, u    string
	bt, bv, t, v    float64
	hasBN, hasBT    bool
	hasBU, hasBV    bool
	hasV, hasT      bool
	other           string // vs, vb, vd or s: a value type we do not aggregate
	mustUnderstand  string
	hasN, hasU      bool
	timeErr, valErr bool
}

// 2^28: RFC 8428 §4.5.3, times below this are relative to now.
const senmlRelative = 1 << 28

// decodeSenML decodes a SenML pack: an array of records whose base fields
// carry forward to the records that follow (RFC 8428 §4.1). Each record is a
// reading or a rejection; an invalid pack as a whole is an error.
func decodeSenML(topicDevice string, b []byte, now time.Time, h Handler) error {
	s := scanner{b: b}
	// Validate the whole pack first so that a syntax error anywhere
	// refuses it whole rather than after some readings went through.
	if err := s.skip(0); err != nil {
		return jsonError(err)
	}
	if err := s.end(); err != nil {
		return jsonError(err)
	}
	s = scanner{b: b}
	s.i++ // '['
	var base senmlRecord
	cnt := counter(h)
	if s.peek() == ']' {
		return &Error{Reason: ReasonEmpty, Detail: "SenML pack has no records"}
	}
	for idx := 0; ; idx++ {
		if s.kind() != kindObject {
			return &Error{Reason: ReasonInvalidJSON, Detail: fmt.Sprintf("SenML record %d is not an object", idx)}
		}
		var rec senmlRecord
		if err := s.senmlFields(&rec); err != nil {
			return jsonError(err)
		}
		if rec.hasBN {
			base.bn, base.hasBN = rec.bn, true
		}
		if rec.hasBT {
			base.bt, base.hasBT = rec.bt, true
		}
		if rec.hasBU {
			base.bu, base.hasBU = rec.bu, true
		}
		if rec.hasBV {
			base.bv, base.hasBV = rec.bv, true
		}
		if r, e := resolveSenML(topicDevice, &base, &rec, idx, now, cnt); e == errCounted {
			// counted, not described
		} else if e != nil {
			h.Reject(e)
		} else {
			h.Reading(r)
		}
		if s.peek() == ',' {
			s.i++
			continue
		}
		s.i++ // ']', checked by the validation pass
		return nil
	}
}

// resolveSenML makes record idx of a pack into a reading, or says why it
// is refused. A refusal cnt counts is errCounted: the item's name and
// detail are made only for a refusal that is described.
func resolveSenML(topicDevice string, base, rec *senmlRecord, idx int, now time.Time, cnt Counter) (aggregate.Reading, *Error) {
	item := func() string {
		if rec.n != "" {
			return fmt.Sprintf("record %d (%s)", idx, base.bn+rec.n)
		}
		return fmt.Sprintf("record %d", idx)
	}
	var r aggregate.Reading
	switch {
	case topicDevice != "":
		r.Device = topicDevice
		r.Metric = rec.n
		if r.Metric == "" {
			r.Metric = base.bn
		}
	default:
		r.Device = strings.TrimRight(base.bn, ":/.")
		r.Metric = rec.n
		if r.Device == "" {
			if counted(cnt, ReasonName) {
				return r, errCounted
			}
			return r, &Error{Reason: ReasonName, Item: item(), Detail: `the topic names no device, so the pack needs a base name "bn" naming it`}
		}
	}
	for _, n := range [...]struct{ what, name string }{{"device", r.Device}, {"metric", r.Metric}} {
		if validName(n.name) {
			continue
		}
		if counted(cnt, ReasonName) {
			return r, errCounted
		}
		e := checkName(n.what, n.name)
		e.Item = item()
		return r, e
	}
	var reason Reason
	switch {
	case rec.mustUnderstand != "":
		reason = ReasonUnsupported
	case rec.timeErr || rec.valErr:
		reason = ReasonInvalidJSON
	case rec.hasV:
		r.Value = base.bv + rec.v
		if math.IsInf(r.Value, 0) {
			reason = ReasonRange
		}
	case rec.other != "":
		reason = ReasonUnsupported
	case base.hasBV:
		r.Value = base.bv
	default:
		reason = ReasonNoValue
	}
	if reason != "" {
		if counted(cnt, reason) {
			return r, errCounted
		}
		e := &Error{Reason: reason, Item: item()}
		switch {
		case rec.mustUnderstand != "":
			e.Detail = fmt.Sprintf("field %q must be understood (RFC 8428 §4.4) and is not", rec.mustUnderstand)
		case rec.timeErr || rec.valErr:
			e.Detail = "a time or value field is not a number"
		case reason == ReasonRange:
			e.Detail = "bv + v overflows"
		case rec.other != "":
			e.Detail = fmt.Sprintf("SenML %q values are not aggregated; only numeric \"v\"", rec.other)
		default:
			e.Detail = `record has no "v"`
		}
		return r, e
	}
	r.Unit = base.bu
	if rec.hasU {
		r.Unit = rec.u
	}
	r.Time, r.Timing = now, aggregate.GatewayTime
	if rec.hasT || base.hasBT {
		ts := base.bt + rec.t
		if ts < senmlRelative {
			// Relative to now: the gateway's clock, shifted.
			r.Time = now.Add(time.Duration(ts * float64(time.Second)))
		} else {
			if (ts < 0 || ts >= msThreshold) && counted(cnt, ReasonTimestamp) {
				return r, errCounted // secondsTime would refuse it
			}
			t, err := secondsTime(ts)
			if err != nil {
				err.Item = item()
				return r, err
			}
			r.Time, r.Timing = t, aggregate.DeviceTime
		}
	}
	return r, nil
}

// senmlFields reads one record object into rec.
func (s *scanner) senmlFields(rec *senmlRecord) error {
	return s.objectFields(func(key []byte, esc bool) error {
		if esc {
			return s.skip(0)
		}
		num := func(dst *float64, has *bool, bad *bool) error {
			if s.kind() != kindNumber {
				*bad = true
				return s.skip(0)
			}
			v, err := s.number()
			if err != nil {
				*bad = true
				return nil
			}
			*dst = v
			if has != nil {
				*has = true
			}
			return nil
		}
		text := func(dst *string, has *bool) error {
			if s.kind() != kindString {
				rec.valErr = true
				return s.skip(0)
			}
			v, err := s.str()
			if err != nil {
				return err
			}
			*dst, *has = v, true
			return nil
		}
		switch string(key) {
		case "bn":
			return text(&rec.bn, &rec.hasBN)
		case "bu":
			return text(&rec.bu, &rec.hasBU)
		case "n":
			return text(&rec.n, &rec.hasN)
		case "u":
			return text(&rec.u, &rec.hasU)
		case "bt":
			return num(&rec.bt, &rec.hasBT, &rec.timeErr)
		case "t":
			return num(&rec.t, &rec.hasT, &rec.timeErr)
		case "bv":
			return num(&rec.bv, &rec.hasBV, &rec.valErr)
		case "v":
			return num(&rec.v, &rec.hasV, &rec.valErr)
		case "vs", "vb", "vd", "s":
			rec.other = string(key)
			return s.skip(0)
		default:
			if len(key) > 0 && key[len(key)-1] == '_' {
				rec.mustUnderstand = string(key)
			}
			return s.skip(0)
		}
	})
}

// trimJSONSpace trims the white space JSON allows (RFC 8259 §2: space, tab,
// line feed, carriage return), and no other.
func trimJSONSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// bareNumber parses a payload that is just a number.
func bareNumber(b []byte) (float64, error) {
	if n := numberLen(b); n == len(b) {
		v, err := parseFloat(b)
		if err != nil {
			return 0, rangeError("", b)
		}
		return v, nil
	}
	lower := strings.ToLower(string(b))
	if strings.Contains(lower, "nan") || strings.Contains(lower, "inf") {
		return 0, &Error{Reason: ReasonNonFinite, Detail: fmt.Sprintf("payload %s: NaN and infinities are not readings", quoteShort(b))}
	}
	if lower == "true" || lower == "false" {
		return 0, &Error{Reason: ReasonUnsupported, Detail: "boolean values are not aggregated"}
	}
	return 0, &Error{Reason: ReasonNotNumber, Detail: fmt.Sprintf(`payload %s is not a number (send e.g. 21.5 or {"v":21.5,"t":"2026-11-30T10:00:00Z"})`, quoteShort(b))}
}

func rangeError(item string, b []byte) *Error {
	d := "number is too large for a 64-bit float"
	if b != nil {
		d = fmt.Sprintf("%s is too large for a 64-bit float", quoteShort(b))
	}
	return &Error{Reason: ReasonRange, Item: item, Detail: d}
}

func jsonError(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Reason: ReasonInvalidJSON, Detail: err.Error()}
}

// quoteShort quotes at most 40 bytes of b for an error message.
func quoteShort(b []byte) string {
	if len(b) > 40 {
		return fmt.Sprintf("%q...", b[:40])
	}
	return fmt.Sprintf("%q", b)
}

// validName and validKey report whether checkName accepts a name,
// without making the error.
func validName(name string) bool { return nameBytesOK(name) && utf8.ValidString(name) }
func validKey(key []byte) bool   { return nameBytesOK(key) && utf8.Valid(key) }

func nameBytesOK[S string | []byte](name S) bool {
	if len(name) == 0 || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '/' || c == '+' || c == '#' {
			return false
		}
	}
	return true
}

func checkName(what, name string) *Error {
	switch {
	case name == "":
		return &Error{Reason: ReasonName, Detail: what + " name is empty"}
	case len(name) > MaxNameLen:
		return &Error{Reason: ReasonName, Item: name[:32] + "...", Detail: fmt.Sprintf("%s name is longer than %d bytes", what, MaxNameLen)}
	case !utf8.ValidString(name):
		return &Error{Reason: ReasonName, Detail: what + " name is not valid UTF-8"}
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '/' || c == '+' || c == '#' {
			return &Error{Reason: ReasonName, Item: name, Detail: fmt.Sprintf("%s name may not contain control characters, '/', '+' or '#'", what)}
		}
	}
	return nil
}

// Unix time magnitudes that tell seconds, milliseconds, microseconds and
// nanoseconds apart. 1e11 seconds is the year 5138, and 1e11 milliseconds
// is March 1973: no sensor sends either, so the ranges do not overlap in
// practice.
const (
	msThreshold = 1e11
	usThreshold = 1e14
	nsThreshold = 1e17
)

// timestamp reads a "t" value: RFC 3339 text, or Unix seconds, milliseconds,
// microseconds or nanoseconds as a number.
func (s *scanner) timestamp(now time.Time) (time.Time, error) {
	switch s.kind() {
	case kindString:
		raw, esc, err := s.rawString()
		if err != nil {
			return time.Time{}, err
		}
		if esc {
			return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: "timestamp string has escapes"}
		}
		t, err := time.Parse(time.RFC3339Nano, string(raw))
		if err != nil {
			return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: fmt.Sprintf(`"t" %s is not RFC 3339 (e.g. "2026-11-30T10:00:00.123Z") nor a Unix time number`, quoteShort(raw))}
		}
		return t, nil
	case kindNumber:
		v, err := s.number()
		if err != nil {
			return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: `"t" is out of range`}
		}
		t, e := unixTime(v)
		if e != nil {
			return time.Time{}, e
		}
		return t, nil
	default:
		if err := s.skip(0); err != nil {
			return time.Time{}, err
		}
		return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: `"t" must be an RFC 3339 string or a Unix time number`}
	}
}

// unixTime interprets v as Unix seconds, ms, µs or ns by its magnitude.
func unixTime(v float64) (time.Time, *Error) {
	switch {
	case v < 0:
		return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: fmt.Sprintf(`"t" %g is before 1970`, v)}
	case v >= 9.2e18:
		return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: fmt.Sprintf(`"t" %g is out of range`, v)}
	case v >= nsThreshold:
		return time.Unix(0, int64(v)), nil
	case v >= usThreshold:
		return time.Unix(0, int64(v*1e3)), nil
	case v >= msThreshold:
		sec := math.Floor(v / 1e3)
		return time.Unix(int64(sec), int64(math.Round((v-sec*1e3)*1e6))), nil
	}
	return secondsTime(v)
}

// secondsTime converts fractional Unix seconds, rounding to the microsecond
// (a float64 holds about that much precision for current times).
func secondsTime(v float64) (time.Time, *Error) {
	if v < 0 || v >= msThreshold {
		return time.Time{}, &Error{Reason: ReasonTimestamp, Detail: fmt.Sprintf("time %g is out of range for Unix seconds", v)}
	}
	sec := math.Floor(v)
	us := math.Round((v - sec) * 1e6)
	return time.Unix(int64(sec), int64(us)*1e3), nil
}
