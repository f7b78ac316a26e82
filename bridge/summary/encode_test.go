package summary_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/summary"
)

func TestSummaryJSONMatchesEncodingJSON(t *testing.T) {
	s := summary.Summary{
		ID: "00112233445566778899aabbccddeeff", Gateway: "gw<1>&", Device: "dev \"q\"\n\t\x01é\u2028",
		Metric: "temp_c", Unit: "°C", WindowStart: w0, WindowEnd: w0.Add(time.Minute),
		Count: 3, Min: -1e-7, Max: 1e21, Sum: 123.456, Mean: 0.1, First: -0, Last: 1e20, Stddev: 2.5e-9,
		Revision: 2, Late: 1,
	}
	want, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	if got := summary.AppendJSON(nil, &s); string(got) != string(want) {
		t.Errorf("AppendJSON:\n got %s\nwant %s", got, want)
	}
	var back summary.Summary
	if err := json.Unmarshal(summary.AppendJSON(nil, &s), &back); err != nil || back != s {
		t.Errorf("round trip: %v\n got %+v\nwant %+v", err, back, s)
	}
}

func TestRecordKey(t *testing.T) {
	s := valid("dev-1", 0, 0)
	if got := string(summary.RecordKey(&s)); got != "gw-1/dev-1" {
		t.Errorf("summary key %q", got)
	}
	d := summary.DeadLetter{Gateway: "gw-1"}
	if got := string(d.RecordKey()); got != "gw-1" {
		t.Errorf("dead-letter key without device %q", got)
	}
	d.Device = "a"
	if got := string(d.RecordKey()); got != "gw-1/a" {
		t.Errorf("dead-letter key %q", got)
	}
}

// TestDeadLetterJSON: the dead letter is valid JSON with the fields set,
// the payload as text when it is UTF-8 and in base64 otherwise.
func TestDeadLetterJSON(t *testing.T) {
	for name, tc := range map[string]struct {
		d    summary.DeadLetter
		want string
	}{
		"undecodable": {summary.DeadLetter{Gateway: "gw", Reason: "invalid_json", Detail: "x", Source: "mqtt", Topic: "sensors/a",
			Client: "c", Device: "a", ReceivedAt: w0, Payload: []byte{0xff, 'x'}},
			`{"gateway":"gw","reason":"invalid_json","detail":"x","source":"mqtt","topic":"sensors/a","client":"c","received_at":"2026-11-30T10:00:00Z","payload_base64":"/3g=","device":"a"}`},
		"text payload": {summary.DeadLetter{Gateway: "gw", Reason: "invalid_json", ReceivedAt: w0, Payload: []byte(`{"t":<}`)},
			`{"gateway":"gw","reason":"invalid_json","received_at":"2026-11-30T10:00:00Z","payload":"{\"t\":\u003c}"}`},
		"reading": {summary.DeadLetter{Gateway: "gw", Reason: "too_late", Device: "a", ReceivedAt: w0,
			HasReading: true, Metric: "temp_c", Unit: "Cel", Time: w0.Add(-time.Hour), Value: 1e-7},
			`{"gateway":"gw","reason":"too_late","received_at":"2026-11-30T10:00:00Z","device":"a","metric":"temp_c","unit":"Cel","time":"2026-11-30T09:00:00Z","value":1e-7}`},
		"every reason": {summary.DeadLetter{Gateway: "gw", Reason: "unsupported_value", Detail: "s: value is not a number", ReceivedAt: w0,
			Payload: []byte(`{"s":"x"`), PayloadBytes: 20, PayloadSHA256: "ab",
			Reasons: []summary.ReasonCount{{Reason: "unsupported_value", Count: 2, Detail: "s: value is not a number"}, {Reason: "too_many_series", Count: 1}},
			Items: []summary.Item{{Reason: "unsupported_value", Item: "s", Detail: "value is not a number"},
				{Reason: "too_many_series", HasReading: true, Metric: "m", Time: w0, Value: 2}}, ItemsTotal: 3},
			`{"gateway":"gw","reason":"unsupported_value","detail":"s: value is not a number","received_at":"2026-11-30T10:00:00Z","payload":"{\"s\":\"x\"","payload_bytes":20,"payload_sha256":"ab",` +
				`"reasons":[{"reason":"unsupported_value","count":2,"detail":"s: value is not a number"},{"reason":"too_many_series","count":1}],` +
				`"items":[{"reason":"unsupported_value","item":"s","detail":"value is not a number"},{"reason":"too_many_series","metric":"m","time":"2026-11-30T10:00:00Z","value":2}],"items_total":3}`},
	} {
		got := string(tc.d.AppendJSON(nil))
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, tc.want)
		}
		if !json.Valid([]byte(got)) || strings.Contains(got, "\n") {
			t.Errorf("%s: not one line of JSON: %s", name, got)
		}
	}
}
