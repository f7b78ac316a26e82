package configs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// edit returns the text with each old (which must occur once) replaced by
// its new.
func edit(t *testing.T, text string, oldNew ...string) string {
	t.Helper()
	for i := 0; i < len(oldNew); i += 2 {
		if n := strings.Count(text, oldNew[i]); n != 1 {
			t.Fatalf("%q occurs %d times, want once", oldNew[i], n)
		}
		text = strings.Replace(text, oldNew[i], oldNew[i+1], 1)
	}
	return text
}

// lineOf returns the number of the one line of text holding s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	if n := strings.Count(text, s); n != 1 {
		t.Fatalf("%q occurs %d times, want once", s, n)
	}
	return strings.Count(text[:strings.Index(text, s)], "\n") + 1
}

// problemsOf parses text, which must fail with Problems.
func problemsOf(t *testing.T, text string) Problems {
	t.Helper()
	_, err := Parse([]byte(text))
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse error %v (%T), want Problems", err, err)
	}
	return ps
}

// TestThreeMistakesInOneRun is the example: edgegate.yaml with a
// misspelt key, a duration in words and an empty broker list reports all
// three, each with its key, line and fix.
func TestThreeMistakesInOneRun(t *testing.T) {
	good, err := os.ReadFile("edgegate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := edit(t, string(good),
		"\n  listen: 0.0.0.0:1883\n", "\n  listn: 0.0.0.0:1883\n",
		"\n  window: 1m\n", "\n  window: 1 minute\n",
		"\n  brokers: [127.0.0.1:9092]\n", "\n  brokers: []\n")
	listn, window, brokers := lineOf(t, text, "listn:"), lineOf(t, text, "window: 1 minute"), lineOf(t, text, "brokers: []")

	ps := problemsOf(t, text)
	want := Problems{
		{Key: "mqtt.listn", Line: listn, Msg: "unknown key; did you mean mqtt.listen?"},
		{Key: "aggregate.window", Line: window, Msg: `"1 minute" is not a duration; write it as 1m, 90s or 1h30m`},
		{Key: "kafka.brokers", Line: brokers, Msg: "is empty; list at least one Kafka bootstrap broker as host:port, e.g. [kafka-1.example.com:9092]"},
	}
	if !reflect.DeepEqual(ps, want) {
		t.Fatalf("problems:\n%#v\nwant\n%#v", ps, want)
	}
	wantText := fmt.Sprintf("3 problems:\n"+
		"  line %d: mqtt.listn: unknown key; did you mean mqtt.listen?\n"+
		"  line %d: aggregate.window: \"1 minute\" is not a duration; write it as 1m, 90s or 1h30m\n"+
		"  line %d: kafka.brokers: is empty; list at least one Kafka bootstrap broker as host:port, e.g. [kafka-1.example.com:9092]",
		listn, window, brokers)
	if ps.Error() != wantText {
		t.Errorf("error text:\n%s\nwant\n%s", ps, wantText)
	}
}

// TestProblemsOfEveryStage: unknown and duplicate keys, a wrong type, a
// bad size, a bad duration and Validate's rules all come out of one run,
// once each; the bad values keep their defaults, so Validate has nothing to
// add about them (no "0s is out of range" for the sensor's interval).
func TestProblemsOfEveryStage(t *testing.T) {
	text := `mqtt:
  allow_anonymous: true
  recieve_maximum: 10
  max_clients: lots
  allow_anonymous: true
kafka:
  brokers: [kafka:9092]
  deadletter_topic: edge.summaries
storage:
  max_bytes: 10 gigs
  full_policy: panic
sensors:
  - {bus: emulated, address: 0x76, driver: bme280, interval: often, device: board}
`
	want := []struct {
		key, line, fix string
	}{
		{"mqtt.recieve_maximum", "recieve_maximum", "did you mean mqtt.receive_maximum?"},
		{"mqtt.max_clients", "lots", `"lots" is not a whole number; write digits, e.g. 10000 (the default)`},
		{"mqtt.allow_anonymous", "  allow_anonymous: true\nkafka", "already set on line 2; keep one"},
		{"kafka.deadletter_topic", "deadletter_topic", "give dead letters their own topic"},
		{"storage.max_bytes", "10 gigs", `"10 gigs" is not a size; write bytes or a number with a unit, e.g. 512MiB or 2GiB`},
		{"storage.full_policy", "panic", `"panic" is not a policy; use backpressure`},
		{"sensors[0].interval", "often", `"often" is not a duration; write it as 1m, 90s or 1h30m`},
	}
	ps := problemsOf(t, text)
	if len(ps) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(ps), len(want), ps)
	}
	byKey := map[string]Problem{}
	for _, p := range ps {
		if _, twice := byKey[p.Key]; twice {
			t.Errorf("%s reported twice:\n%v", p.Key, ps)
		}
		byKey[p.Key] = p
	}
	for _, w := range want {
		p, ok := byKey[w.key]
		if !ok {
			t.Errorf("no problem with %s:\n%v", w.key, ps)
			continue
		}
		if line := lineOf(t, text, w.line); p.Line != line || !strings.Contains(p.Msg, w.fix) {
			t.Errorf("%s: line %d, %q; want line %d and %q", w.key, p.Line, p.Msg, line, w.fix)
		}
	}
	if !strings.HasPrefix(ps.Error(), fmt.Sprintf("%d problems:\n  line 3: mqtt.recieve_maximum: ", len(want))) {
		t.Errorf("error text:\n%s", ps)
	}
}

// TestNoSecondComplaint: a value that did not decode, or a key misspelt,
// is the one problem reported about its key; what Validate would say of the
// default left in its place (or of the key above or within it) is not.
func TestNoSecondComplaint(t *testing.T) {
	for _, tc := range []struct{ yaml, key string }{
		{"mqtt: 5\nkafka: {brokers: [k:9092]}", "mqtt"},                                          // not "mqtt.users_file: is not set"
		{"mqtt: {users_fle: /etc/edgegate/users}\nkafka: {brokers: [k:9092]}", "mqtt.users_fle"}, // ditto
		{"kafak: {brokers: [k:9092]}\nmqtt: {allow_anonymous: true}", "kafak"},                   // not "kafka.brokers: is required"
		{"mqtt: {allow_anonymous: true}\nkafka: {brokers: k:9092}", "kafka.brokers"},             // not a list; not "is required"
		{"mqtt: {allow_anonymous: true}\nkafka: {brokers: [k:9092, [a]]}", "kafka.brokers[1]"},
		{"mqtt: {allow_anonymous: true, max_sessions: many}\nkafka: {brokers: [k:9092]}", "mqtt.max_sessions"},
		{"mqtt: {allow_anonymous: true}\nkafka: {brokers: [k:9092]}\naggregate: {window: [1m]}", "aggregate.window"},
		{"mqtt: {allow_anonymous: true}\nkafka: {brokers: [k:9092]}\nsensors: [5]", "sensors[0]"},
	} {
		ps := problemsOf(t, tc.yaml)
		if len(ps) != 1 || ps[0].Key != tc.key || ps[0].Line == 0 || !strings.Contains(ps[0].Msg, "; ") {
			t.Errorf("%q: %v, want one problem with %s, its line and a fix", tc.yaml, ps, tc.key)
		}
	}
}

// TestGoodConfigsDecodeAsBefore: decoding key by key gives the Config that
// one yaml Decode over the defaults gave, for every good file and for
// anchors, aliases and empty values.
func TestGoodConfigsDecodeAsBefore(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.good.yaml")
	docs := map[string]string{}
	for _, f := range append(files, "edgegate.yaml") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(b)
	}
	docs["aliases and nulls"] = `mqtt:
  listen: &local "127.0.0.1:1884"
  allow_anonymous: true
  connect_rate_exempt:
  acl:
    users: {ops: admin, dash: lab}
    roles: {lab: {subscribe: &all ["sensors/#"], publish: *all}}
aggregate:
  window:
http: {listen: *local}
kafka: {brokers: [k:9092]}
sensors: [{bus: emulated, address: 0x76, driver: bme280, interval: 10s, device: b, metrics: {temperature: t}}]
`
	for name, doc := range docs {
		got, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := Default()
		if err := yaml.Unmarshal([]byte(doc), &want); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, *got, want)
		}
	}
}

func TestProblemsText(t *testing.T) {
	p := Problem{Key: "aggregate.window", Line: 4, Msg: `"1; 2" is not a duration; write it as 1m, 90s or 1h30m`}
	if got, want := (Problems{p}).Error(), `aggregate.window: "1; 2" is not a duration (line 4); write it as 1m, 90s or 1h30m`; got != want {
		t.Errorf("one problem:\n got %s\nwant %s", got, want)
	}
	ps := Problems{
		{Key: "kafka.brokers", Msg: "is required; list them", Unset: true},
		{Key: "log.level", Msg: `"loud" is not a level; use info`},
		{Key: "storage.max_bytes", Line: 9, Msg: "too small; raise it"},
		p,
	}
	want := "4 problems:\n" +
		"  line 4: aggregate.window: \"1; 2\" is not a duration; write it as 1m, 90s or 1h30m\n" +
		"  line 9: storage.max_bytes: too small; raise it\n" +
		"  kafka.brokers (not in the file): is required; list them\n" +
		"  log.level: \"loud\" is not a level; use info"
	if ps.Error() != want {
		t.Errorf("problems:\n got %s\nwant %s", ps, want)
	}
}
