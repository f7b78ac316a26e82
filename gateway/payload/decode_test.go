package payload

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

var arrival = time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)

type collect struct {
	readings []aggregate.Reading
	rejects  []*Error
}

func (c *collect) Reading(r aggregate.Reading) { c.readings = append(c.readings, r) }
func (c *collect) Reject(e *Error)             { c.rejects = append(c.rejects, e) }

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func newTestDecoder(t testing.TB) *Decoder {
	d, err := NewDecoder([]string{"sensors/{device}/{metric}", "sensors/{device}", "senml"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDecode(t *testing.T) {
	// Readings stamped at the arrival are the gateway's (rg: at a time
	// relative to it); the others their device's.
	r := func(dev, metric, unit string, at time.Time, v float64) aggregate.Reading {
		timing := aggregate.DeviceTime
		if at.Equal(arrival) {
			timing = aggregate.GatewayTime
		}
		return aggregate.Reading{Device: dev, Metric: metric, Unit: unit, Time: at, Value: v, Timing: timing}
	}
	rg := func(dev, metric, unit string, at time.Time, v float64) aggregate.Reading {
		return aggregate.Reading{Device: dev, Metric: metric, Unit: unit, Time: at, Value: v, Timing: aggregate.GatewayTime}
	}
	tests := map[string]struct {
		topic   string
		payload string
		want    []aggregate.Reading
		rejects []Reason // per-item refusals, in order
		err     Reason   // whole-payload refusal
	}{
		"bare number":                 {topic: "sensors/d1/temp", payload: "21.5", want: []aggregate.Reading{r("d1", "temp", "", arrival, 21.5)}},
		"bare number with newline":    {topic: "sensors/d1/temp", payload: " -3e2\n", want: []aggregate.Reading{r("d1", "temp", "", arrival, -300)}},
		"bare integer zero":           {topic: "sensors/d1/temp", payload: "0", want: []aggregate.Reading{r("d1", "temp", "", arrival, 0)}},
		"v only":                      {topic: "sensors/d1/temp", payload: `{"v": 21.5}`, want: []aggregate.Reading{r("d1", "temp", "", arrival, 21.5)}},
		"v and RFC 3339 t":            {topic: "sensors/d1/temp", payload: `{"v":21.5,"t":"2026-11-30T10:00:00.123Z"}`, want: []aggregate.Reading{r("d1", "temp", "", ts("2026-11-30T10:00:00.123Z"), 21.5)}},
		"v and t with offset":         {topic: "sensors/d1/temp", payload: `{"t":"2026-11-30T11:00:00+01:00","v":1}`, want: []aggregate.Reading{r("d1", "temp", "", ts("2026-11-30T10:00:00Z"), 1)}},
		"t in Unix seconds":           {topic: "sensors/d1/temp", payload: `{"v":1,"t":1796032800}`, want: []aggregate.Reading{r("d1", "temp", "", time.Unix(1796032800, 0), 1)}},
		"t in fractional seconds":     {topic: "sensors/d1/temp", payload: `{"v":1,"t":1796032800.25}`, want: []aggregate.Reading{r("d1", "temp", "", time.Unix(1796032800, 250e6), 1)}},
		"t in Unix milliseconds":      {topic: "sensors/d1/temp", payload: `{"v":1,"t":1796032800123}`, want: []aggregate.Reading{r("d1", "temp", "", time.Unix(1796032800, 123e6), 1)}},
		"t in Unix microseconds":      {topic: "sensors/d1/temp", payload: `{"v":1,"t":1796032800123456}`, want: []aggregate.Reading{r("d1", "temp", "", time.Unix(1796032800, 123456e3), 1)}},
		"t in Unix nanoseconds":       {topic: "sensors/d1/temp", payload: `{"v":1,"t":1796032800123456789}`, want: []aggregate.Reading{r("d1", "temp", "", time.Unix(1796032800, 123456768), 1)}},
		"v with unit, unknown keys":   {topic: "sensors/d1/temp", payload: `{"v":1,"u":"Cel","seq":7,"meta":{"a":[1,2]}}`, want: []aggregate.Reading{r("d1", "temp", "Cel", arrival, 1)}},
		"object of metrics":           {topic: "sensors/d1", payload: `{"temp_c": 21.5, "rh": 40, "t": "2026-11-30T10:00:00Z"}`, want: []aggregate.Reading{r("d1", "temp_c", "", ts("2026-11-30T10:00:00Z"), 21.5), r("d1", "rh", "", ts("2026-11-30T10:00:00Z"), 40)}},
		"object without t":            {topic: "sensors/d1", payload: `{"a":1}`, want: []aggregate.Reading{r("d1", "a", "", arrival, 1)}},
		"object escaped key":          {topic: "sensors/d1", payload: `{"temp\u00b0":1}`, want: []aggregate.Reading{r("d1", "temp°", "", arrival, 1)}},
		"object non-numeric field":    {topic: "sensors/d1", payload: `{"a":1,"status":"ok","b":true,"c":null,"d":2}`, want: []aggregate.Reading{r("d1", "a", "", arrival, 1), r("d1", "d", "", arrival, 2)}, rejects: []Reason{ReasonUnsupported, ReasonUnsupported, ReasonUnsupported}},
		"object field bad name":       {topic: "sensors/d1", payload: `{"a/b":1,"c":2}`, want: []aggregate.Reading{r("d1", "c", "", arrival, 2)}, rejects: []Reason{ReasonName}},
		"object huge number field":    {topic: "sensors/d1", payload: `{"a":1e999,"c":2}`, want: []aggregate.Reading{r("d1", "c", "", arrival, 2)}, rejects: []Reason{ReasonRange}},
		"empty object":                {topic: "sensors/d1", payload: `{}`},
		"senml with base fields":      {topic: "sensors/d1", payload: `[{"bn":"urn:dev:ow:1:","bt":1796032800,"bu":"Cel","n":"temp","v":21.5},{"n":"temp","t":10,"v":22},{"n":"rh","u":"%RH","v":40}]`, want: []aggregate.Reading{r("d1", "temp", "Cel", time.Unix(1796032800, 0), 21.5), r("d1", "temp", "Cel", time.Unix(1796032810, 0), 22), r("d1", "rh", "%RH", time.Unix(1796032800, 0), 40)}},
		"senml base value added":      {topic: "sensors/d1", payload: `[{"bv":100,"n":"p","v":1.5},{"n":"p","v":-1}]`, want: []aggregate.Reading{r("d1", "p", "", arrival, 101.5), r("d1", "p", "", arrival, 99)}},
		"senml relative time":         {topic: "sensors/d1", payload: `[{"n":"t","t":-5,"v":1},{"n":"t","v":2}]`, want: []aggregate.Reading{rg("d1", "t", "", arrival.Add(-5*time.Second), 1), r("d1", "t", "", arrival, 2)}},
		"senml device from bn":        {topic: "senml", payload: `[{"bn":"dev7:","n":"temp","v":3}]`, want: []aggregate.Reading{r("dev7", "temp", "", arrival, 3)}},
		"senml no bn on device-less":  {topic: "senml", payload: `[{"n":"temp","v":3}]`, rejects: []Reason{ReasonName}},
		"senml string/bool/data":      {topic: "sensors/d1", payload: `[{"n":"a","vs":"x"},{"n":"b","vb":true},{"n":"c","vd":"AA"},{"n":"d","v":4},{"n":"e","s":3}]`, want: []aggregate.Reading{r("d1", "d", "", arrival, 4)}, rejects: []Reason{ReasonUnsupported, ReasonUnsupported, ReasonUnsupported, ReasonUnsupported}},
		"senml must-understand":       {topic: "sensors/d1", payload: `[{"n":"a","v":1,"xyz_":1}]`, rejects: []Reason{ReasonUnsupported}},
		"senml missing value":         {topic: "sensors/d1", payload: `[{"n":"a"}]`, rejects: []Reason{ReasonNoValue}},
		"senml empty pack":            {topic: "sensors/d1", payload: `[]`, err: ReasonEmpty},
		"senml record not object":     {topic: "sensors/d1", payload: `[1]`, err: ReasonInvalidJSON},
		"senml truncated":             {topic: "sensors/d1", payload: `[{"n":"a","v":1},{"n":"b"`, err: ReasonInvalidJSON},
		"empty payload":               {topic: "sensors/d1/temp", payload: "", err: ReasonEmpty},
		"blank payload":               {topic: "sensors/d1/temp", payload: " \n", err: ReasonEmpty},
		"not a number":                {topic: "sensors/d1/temp", payload: "hot", err: ReasonNotNumber},
		"hex float refused":           {topic: "sensors/d1/temp", payload: "0x1p-2", err: ReasonNotNumber},
		"leading plus refused":        {topic: "sensors/d1/temp", payload: "+1", err: ReasonNotNumber},
		"trailing garbage":            {topic: "sensors/d1/temp", payload: "21.5C", err: ReasonNotNumber},
		"NaN":                         {topic: "sensors/d1/temp", payload: "NaN", err: ReasonNonFinite},
		"Inf":                         {topic: "sensors/d1/temp", payload: "-Inf", err: ReasonNonFinite},
		"overflow":                    {topic: "sensors/d1/temp", payload: "1e400", err: ReasonRange},
		"boolean":                     {topic: "sensors/d1/temp", payload: "true", err: ReasonUnsupported},
		"invalid JSON object":         {topic: "sensors/d1/temp", payload: `{"v":1,}`, err: ReasonInvalidJSON},
		"v is a string":               {topic: "sensors/d1/temp", payload: `{"v":"21.5"}`, err: ReasonUnsupported},
		"no v":                        {topic: "sensors/d1/temp", payload: `{"t":1796032800}`, err: ReasonNoValue},
		"unknown time format":         {topic: "sensors/d1/temp", payload: `{"v":1,"t":"30/11/2026 10:00"}`, err: ReasonTimestamp},
		"negative time":               {topic: "sensors/d1/temp", payload: `{"v":1,"t":-1}`, err: ReasonTimestamp},
		"time as bool":                {topic: "sensors/d1/temp", payload: `{"v":1,"t":true}`, err: ReasonTimestamp},
		"object bad t refuses all":    {topic: "sensors/d1", payload: `{"a":1,"t":"yesterday"}`, err: ReasonTimestamp},
		"bare number on device topic": {topic: "sensors/d1", payload: `21.5`, err: ReasonForm},
		"garbage on device topic":     {topic: "sensors/d1", payload: `hello`, err: ReasonInvalidJSON},
		"huge":                        {topic: "sensors/d1/temp", payload: strings.Repeat("1", DefaultMaxPayload+1), err: ReasonTooLarge},
		"deeply nested":               {topic: "sensors/d1", payload: `{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, err: ReasonInvalidJSON},
		"control char in device":      {topic: "sensors/d\x01/temp", payload: "1", err: ReasonName},
	}
	d := newTestDecoder(t)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var c collect
			matched, err := d.Decode(tc.topic, []byte(tc.payload), arrival, &c)
			if !matched {
				t.Fatal("topic did not match")
			}
			if tc.err != "" {
				var e *Error
				if !errors.As(err, &e) || e.Reason != tc.err {
					t.Fatalf("err = %v, want reason %s", err, tc.err)
				}
				if len(c.readings) != 0 {
					t.Errorf("refused payload still produced %d readings", len(c.readings))
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if len(c.readings) != len(tc.want) {
				t.Fatalf("readings = %+v, want %+v", c.readings, tc.want)
			}
			for i := range tc.want {
				g, w := c.readings[i], tc.want[i]
				if g.Device != w.Device || g.Metric != w.Metric || g.Unit != w.Unit || !g.Time.Equal(w.Time) || g.Value != w.Value || g.Timing != w.Timing {
					t.Errorf("reading %d = %+v, want %+v", i, g, w)
				}
			}
			var got []Reason
			for _, e := range c.rejects {
				got = append(got, e.Reason)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.rejects) {
				t.Errorf("rejects = %v, want %v (%v)", got, tc.rejects, c.rejects)
			}
		})
	}
}

func TestPatterns(t *testing.T) {
	p, err := CompilePattern("site/a/{device}/x/{metric}")
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string][2]string{
		"site/a/d1/x/temp": {"d1", "temp"},
		"site/a/d1/y/temp": {"", ""},
		"site/a/d1/x":      {"", ""},
		"site/a/d1/x/t/u":  {"", ""},
		"site/a//x/temp":   {"", ""},
		"site/a/d1/x/":     {"", ""},
	} {
		d, m, ok := p.Match(topic)
		if ok != (want[0] != "") || d != want[0] || m != want[1] {
			t.Errorf("Match(%q) = %q %q %v, want %q %q", topic, d, m, ok, want[0], want[1])
		}
	}
	if f := p.Filter(); f != "site/a/+/x/+" {
		t.Errorf("Filter = %q", f)
	}
	for _, bad := range []string{"", "a/+/b", "a/#", "a/{device}/{device}", "a/{dev}", "a//{device}", "a/x{device}"} {
		if _, err := CompilePattern(bad); err == nil {
			t.Errorf("CompilePattern(%q) accepted", bad)
		}
	}
	d := newTestDecoder(t)
	if matched, err := d.Decode("other/topic", []byte("1"), arrival, &collect{}); matched || err != nil {
		t.Errorf("unmatched topic: matched %v err %v", matched, err)
	}
}

// FuzzDecode checks that no input panics or hangs the decoder, that every
// reading it returns is finite and named, and that for the {"v"} and object
// forms it agrees with encoding/json.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"21.5", "-0", "1e308", "NaN", `{"v":1,"t":"2026-11-30T10:00:00Z"}`, `{"v":1,"t":1796032800123}`,
		`{"temp_c":21.5,"rh":40,"t":1796032800}`, `{"a\u0041":1}`, `[{"bn":"d:","n":"t","v":1,"bt":1796032800}]`,
		`[{"n":"a","vs":"x"},{"n":"b","v":2,"t":-3}]`, `{"a":[1,{"b":null}],"c":true}`, `{"a":"\ud83d\ude00"}`,
	} {
		f.Add("sensors/d1/m", []byte(s))
		f.Add("sensors/d1", []byte(s))
	}
	d, err := NewDecoder([]string{"sensors/{device}/{metric}", "sensors/{device}", "senml"}, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		var c collect
		_, err := d.Decode(topic, payload, arrival, &c)
		for _, r := range c.readings {
			if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Device == "" || r.Metric == "" || r.Time.IsZero() {
				t.Fatalf("bad reading %+v from %q", r, payload)
			}
		}
		if err != nil {
			return
		}
		valid := json.Valid(payload)
		_, _, ok := d.patterns[0].Match(topic)
		if ok && len(payload) > 0 && (payload[0] == '{') {
			if !valid {
				t.Fatalf("accepted invalid JSON %q", payload)
			}
			var m map[string]any
			if json.Unmarshal(payload, &m) == nil && len(c.readings) == 1 {
				if v, _ := m["v"].(float64); v != c.readings[0].Value {
					t.Fatalf("%q: v = %v, encoding/json says %v", payload, c.readings[0].Value, m["v"])
				}
			}
		}
		if _, _, ok := d.patterns[1].Match(topic); ok && !d.patterns[0].matches(topic) && len(payload) > 0 {
			if !valid {
				t.Fatalf("accepted invalid JSON %q", payload)
			}
			var m map[string]any
			err := json.Unmarshal(payload, &m)
			_, hasT := m["t"]
			items := len(c.readings) + len(c.rejects)
			if hasT {
				items++
			}
			// With duplicate keys encoding/json keeps the last while the
			// gateway takes each occurrence as a reading; compare only
			// objects without duplicates.
			if err == nil && items == len(m) {
				// Every numeric field except "t" is a reading, with the
				// value encoding/json reads.
				want := 0
				for k, v := range m {
					if _, isNum := v.(float64); isNum && k != "t" {
						want++
					}
				}
				seen := map[string]float64{}
				for _, r := range c.readings {
					seen[r.Metric] = r.Value
				}
				for k, v := range seen {
					if m[k] != v {
						t.Fatalf("%q: %s = %v, encoding/json says %v", payload, k, v, m[k])
					}
				}
				if len(seen) > want {
					t.Fatalf("%q: %d metrics, encoding/json sees %d numbers", payload, len(seen), want)
				}
			}
		}
	})
}

func (p *Pattern) matches(topic string) bool { _, _, ok := p.Match(topic); return ok }

func BenchmarkDecodeBareNumber(b *testing.B) {
	d := newTestDecoder(b)
	payload := []byte("21.5")
	var h discard
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode("sensors/dev-0001/temp", payload, arrival, &h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeVT(b *testing.B) {
	d := newTestDecoder(b)
	payload := []byte(`{"v":21.5,"t":1796032800123}`)
	var h discard
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode("sensors/dev-0001/temp", payload, arrival, &h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSenML(b *testing.B) {
	d := newTestDecoder(b)
	payload := []byte(`[{"bn":"dev:","bt":1796032800,"bu":"Cel","n":"temp","v":21.5},{"n":"rh","u":"%RH","v":40},{"n":"p","u":"Pa","v":101325}]`)
	var h discard
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode("sensors/dev-0001", payload, arrival, &h); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{ n int }

func (d *discard) Reading(aggregate.Reading) { d.n++ }
func (d *discard) Reject(*Error)             {}

// countingHandler keeps the details of keep refusals and counts the
// rest by reason, as the gateway's dead letter does (Counter).
type countingHandler struct {
	keep     int
	rejected []*Error
	counted  map[Reason]int
	readings int
}

func (c *countingHandler) Reading(aggregate.Reading) { c.readings++ }
func (c *countingHandler) Reject(e *Error)           { c.rejected = append(c.rejected, e) }
func (c *countingHandler) Counted(r Reason) bool {
	if len(c.rejected) < c.keep {
		return false
	}
	c.counted[r]++
	return true
}

// TestDecodeCounted: past what a Counter keeps, the refused items of a
// JSON object or a SenML pack are counted by reason, not described (each
// description is an error message the single applier formats).
func TestDecodeCounted(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		topic, payload string
		readings       int
		counted        map[Reason]int
	}{
		"object": {"s/d", `{"a":"x","b":true,"":1,"c/d":2,"e":"y","ok":1,"f":null,"g":1e999}`, 1,
			map[Reason]int{ReasonUnsupported: 2, ReasonName: 2, ReasonRange: 1}},
		"senml": {"s/d", `[{"n":"a","vs":"x"},{"n":"b","vb":true},{},{"n":"c","v":"1"},{"n":"ok","v":1},{"n":"d","t":1e12,"v":1},{"n":"e"},{"n":"x","y_":1,"v":1}]`, 1,
			map[Reason]int{ReasonUnsupported: 1, ReasonName: 1, ReasonInvalidJSON: 1,
				ReasonTimestamp: 1, ReasonNoValue: 1}},
		"senml without device": {"s", `[{"n":"a","vs":"x"},{"n":"b","v":1},{"n":"c","v":2}]`, 0,
			map[Reason]int{ReasonName: 1}},
	}
	dec, err := NewDecoder([]string{"s/{device}", "s"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := &countingHandler{keep: 2, counted: map[Reason]int{}}
			if _, err := dec.Decode(c.topic, []byte(c.payload), now, h); err != nil {
				t.Fatal(err)
			}
			if len(h.rejected) != 2 || h.readings != c.readings || !maps.Equal(h.counted, c.counted) {
				t.Errorf("%d described (%v), %d readings, counted %v; want 2 described, %d readings, counted %v",
					len(h.rejected), h.rejected, h.readings, h.counted, c.readings, c.counted)
			}
		})
	}
}
