package summary_test

import (
	"bufio"
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/edgegate/edgegate/bridge/summary"
)

var w0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func valid(dev string, minute, rev int) summary.Summary {
	s := summary.Summary{Gateway: "gw-1", Device: dev, Metric: "temp_c", Unit: "Cel", WindowStart: w0.Add(time.Duration(minute) * time.Minute),
		WindowEnd: w0.Add(time.Duration(minute+1) * time.Minute), Count: 3, Min: 20.5, Max: 21.5, Sum: 63, Mean: 21, First: 20.5, Last: 21.5,
		Stddev: 0.408248290463863, Revision: rev, TimeSource: "device"}
	if rev > 0 {
		s.Late = 1
	}
	s.ID = summary.ID(s.Gateway, s.Device, s.Metric, s.WindowStart, rev)
	return s
}

// encode writes s as the gateway does.
func encode(s summary.Summary) string { return string(summary.AppendJSON(nil, &s)) }

func headers(kv ...string) []summary.Header {
	var h []summary.Header
	for i := 0; i < len(kv); i += 2 {
		h = append(h, summary.Header{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	return h
}

func TestDecode(t *testing.T) {
	good := encode(valid("dev-1", 0, 0))
	std := headers("edgegate-gateway", "gw-1", "edgegate-schema-version", "1", "content-type", "application/json")
	for _, tc := range []struct {
		name    string
		value   string
		headers []summary.Header
		want    string // error substring; empty: decodes to valid("dev-1", 0, 0)
	}{
		{"as the gateway writes it", good, std, ""},
		{"no headers", good, nil, ""},
		{"an added field", strings.Replace(good, `"late":0`, `"late":0,"quality":"good"`, 1), std, ""},
		{"newer schema", good, headers("edgegate-schema-version", "2"), "schema version 2 is newer than this consumer's 1"},
		{"bad schema header", good, headers("edgegate-schema-version", "x"), `schema version "x" is not a version`},
		{"not JSON", good, headers("content-type", "application/avro"), `content type "application/avro"`},
		{"gateway header differs", good, headers("edgegate-gateway", "gw-2"), `gateway header "gw-2" differs from the value's gateway "gw-1"`},
		{"missing fields", `{"id":"x","gateway":"g"}`, nil, "missing fields: device, metric, unit, window_start"},
		{"wrong type", strings.Replace(good, `"count":3`, `"count":"3"`, 1), nil, "decode summary"},
		{"not an object", `[1,2]`, nil, "not a JSON object"},
		// Records of gateways before the time fields: decoded with an
		// empty (unknown) time source.
		{"without the time fields", good[:strings.Index(good, `,"time_source"`)] + "}", std, "unknown time source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := summary.Decode([]byte(tc.value), tc.headers)
			if tc.want == "unknown time source" {
				want := valid("dev-1", 0, 0)
				want.TimeSource = ""
				if err != nil || s != want || summary.Validate(s) != nil {
					t.Errorf("got %+v, %v", s, err)
				}
				return
			}
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("err %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || s != valid("dev-1", 0, 0) {
				t.Errorf("got %+v, %v", s, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*summary.Summary)
		want   string
	}{
		{"valid", func(*summary.Summary) {}, ""},
		{"valid revision", func(s *summary.Summary) {
			s.Revision, s.Late = 2, 1
			s.ID = summary.ID(s.Gateway, s.Device, s.Metric, s.WindowStart, 2)
		}, ""},
		{"empty device", func(s *summary.Summary) { s.Device = "" }, "device is empty"},
		{"empty window", func(s *summary.Summary) { s.WindowEnd = s.WindowStart }, "is not after window_start"},
		{"no readings", func(s *summary.Summary) { s.Count = 0 }, "count 0"},
		{"last above max", func(s *summary.Summary) { s.Last = 30 }, "last 30 is outside [min 20.5, max 21.5]"},
		{"mean below min", func(s *summary.Summary) { s.Mean = 1 }, "mean 1 is outside"},
		{"negative stddev", func(s *summary.Summary) { s.Stddev = -1 }, "stddev -1 is negative"},
		{"late beyond count", func(s *summary.Summary) { s.Late = 4 }, "late 4 is outside [0, count 3]"},
		{"wrong id", func(s *summary.Summary) { s.Revision = 1 }, "is not the id of this gateway, device, metric, window and revision"},
		{"gateway times", func(s *summary.Summary) { s.TimeSource, s.TimeRebased, s.TimeUnverified = "gateway", 2, 1 }, ""},
		{"mixed times", func(s *summary.Summary) { s.TimeSource, s.TimeReplaced = "mixed", 1 }, ""},
		{"unknown time source", func(s *summary.Summary) { s.TimeSource = "ntp" }, `time_source "ntp" is not device, gateway or mixed`},
		{"time counts beyond count", func(s *summary.Summary) { s.TimeSource, s.TimeRebased, s.TimeUnverified = "gateway", 2, 2 },
			"time_replaced 0, time_rebased 2 and time_unverified 2 are not counts of at most count 3"},
		{"negative time count", func(s *summary.Summary) { s.TimeSource, s.TimeReplaced = "mixed", -1 }, "are not counts"},
		{"device times, some stamped by the gateway", func(s *summary.Summary) { s.TimeReplaced = 1 }, "time_source is device but"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := valid("dev-1", 0, 0)
			tc.change(&s)
			err := summary.Validate(s)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	var m summary.Merged
	for i, tc := range []struct {
		s    summary.Summary
		want summary.Outcome
	}{
		{valid("a", 0, 0), summary.New},
		{valid("a", 0, 2), summary.Replaced},
		{valid("a", 0, 1), summary.Stale}, // read after revision 2: ignored
		{valid("a", 0, 2), summary.Same},
		{valid("a", 1, 0), summary.New},
		{valid("b", 0, 1), summary.New}, // a revision can come first (revision 0 read before the range)
	} {
		if got := m.Add(tc.s); got != tc.want {
			t.Errorf("#%d: %v, want %v", i, got, tc.want)
		}
	}
	if s, ok := m.Get(summary.KeyOf(valid("a", 0, 0))); !ok || s.Revision != 2 || m.Len() != 3 {
		t.Errorf("a@0: %+v; %d windows", s, m.Len())
	}
	all := m.All()
	if len(all) != 3 || all[0].Device != "a" || all[1].WindowStart != w0.Add(time.Minute) || all[2].Device != "b" {
		t.Errorf("All: %+v", all)
	}
}

// TestSchema: the JSON Schema accepts what the gateway writes (the golden
// file, which the gateway's encoder must reproduce) and refuses broken
// summaries.
func TestSchema(t *testing.T) {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sch, err := c.Compile("summary.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	check := func(line string) error {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(line))
		if err != nil {
			return err
		}
		return sch.Validate(inst)
	}
	var want bytes.Buffer
	mixed, gw := valid("dev-ü", 5, 0), valid("esp-7", 6, 0)
	mixed.TimeSource, mixed.TimeReplaced = "mixed", 1
	gw.TimeSource, gw.TimeRebased, gw.TimeUnverified = "gateway", 2, 1
	for _, s := range []summary.Summary{valid("dev-1", 0, 0), valid("dev-1", 0, 1), mixed, gw} {
		want.WriteString(encode(s) + "\n")
	}
	if os.Getenv("UPDATE_GOLDEN") != "" {
		os.WriteFile("testdata/golden.jsonl", want.Bytes(), 0o644)
	}
	golden, err := os.ReadFile("testdata/golden.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(golden, want.Bytes()) {
		t.Errorf("the gateway's encoder no longer writes testdata/golden.jsonl:\n%s", want.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(golden))
	n := 0
	for sc.Scan() {
		n++
		if err := check(sc.Text()); err != nil {
			t.Errorf("golden line %d: %v", n, err)
		}
		if _, err := summary.Decode(sc.Bytes(), nil); err != nil {
			t.Errorf("golden line %d does not decode: %v", n, err)
		}
	}
	good := encode(valid("dev-1", 0, 0))
	for name, bad := range map[string]string{
		"count 0":                 strings.Replace(good, `"count":3`, `"count":0`, 1),
		"count a string":          strings.Replace(good, `"count":3`, `"count":"3"`, 1),
		"no unit":                 strings.Replace(good, `"unit":"Cel",`, ``, 1),
		"bad window_start":        strings.Replace(good, `"window_start":"2026-11-30T10:00:00Z"`, `"window_start":"10 o'clock"`, 1),
		"bad id":                  strings.Replace(good, `"id":"`, `"id":"X`, 1),
		"negative late":           strings.Replace(good, `"late":0`, `"late":-1`, 1),
		"unknown time_source":     strings.Replace(good, `"time_source":"device"`, `"time_source":"ntp"`, 1),
		"negative time_rebased":   strings.Replace(good, `"time_rebased":0`, `"time_rebased":-1`, 1),
		"time_unverified a float": strings.Replace(good, `"time_unverified":0`, `"time_unverified":0.5`, 1),
	} {
		if check(bad) == nil {
			t.Errorf("%s: the schema accepts %s", name, bad)
		}
	}
}
