package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/firmware-sim/chips"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/broker/auth"
	"github.com/edgegate/edgegate/gateway/sensors"
)

func TestMain(m *testing.M) {
	kafka.DisableMetrics()
	goleak.VerifyTestMain(m)
}

const (
	summariesTopic = "edge.summaries"
	deadTopic      = "edge.deadletter"
)

// t0 is the gateway's (fixed) clock in the integration test.
var t0 = time.Date(2026, 11, 30, 10, 5, 30, 0, time.UTC)

func testConfig(t testing.TB, brokers []string) *configs.Config {
	c := configs.Default()
	c.Gateway.ID = "gw-it"
	c.Gateway.DataDir = t.TempDir()
	c.MQTT.Listen = "127.0.0.1:0"
	c.MQTT.AllowAnonymous = true
	c.MQTT.ACL.AnonymousRole = "admin" // tests choose their client ids freely
	c.Kafka.Brokers = brokers
	c.Aggregate.AllowedLateness = configs.Duration(time.Hour)
	// Tests of the bounds send hundreds of 200 KiB payloads from one
	// client; TestPublishByteRate sets the byte rate.
	c.MQTT.PublishBytesRate = 0
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return &c
}

func quietLog() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// stack is a gateway and forwarder running against kfake.
type stack struct {
	gw      *gateway.Gateway
	fwd     *bridge.Forwarder
	brokers []string
	stopGW  func()
	stopFwd func()
}

func startStack(t *testing.T, cfg *configs.Config, now func() time.Time) *stack {
	t.Helper()
	return startStackIn(t, cfg, now, t.TempDir())
}

// startStackIn is startStack with the forwarder's queue in outbound.
func startStackIn(t *testing.T, cfg *configs.Config, now func() time.Time, outbound string) *stack {
	t.Helper()
	log := quietLog()
	fwd, err := bridge.NewForwarder(bridge.Options{Gateway: cfg.Gateway.ID, SummariesTopic: cfg.Kafka.SummariesTopic,
		DeadletterTopic: cfg.Kafka.DeadletterTopic, Logger: log, Dir: outbound},
		kafka.NewConnector(kafka.Options{Brokers: cfg.Kafka.Brokers, ClientID: "it",
			TransactionalID: cfg.TransactionalID(), OffsetsTopic: cfg.Kafka.OffsetsTopic, PositionKey: cfg.Gateway.ID}))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), output.Forwarder(fwd), log, now)
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{gw: gw, fwd: fwd, brokers: cfg.Kafka.Brokers}
	gctx, gcancel := context.WithCancel(context.Background())
	fctx, fcancel := context.WithCancel(context.Background())
	var gwg, fwg sync.WaitGroup
	gwg.Add(1)
	fwg.Add(1)
	go func() {
		defer gwg.Done()
		if err := gw.Run(gctx); err != nil {
			t.Errorf("gateway: %v", err)
		}
	}()
	go func() {
		defer fwg.Done()
		if err := fwd.Run(fctx); err != nil {
			t.Errorf("forwarder: %v", err)
		}
	}()
	var once, once2 sync.Once
	s.stopGW = func() { once.Do(func() { gcancel(); gwg.Wait() }) }
	s.stopFwd = func() { once2.Do(func() { s.stopGW(); fcancel(); fwg.Wait() }) }
	t.Cleanup(s.stopFwd)
	return s
}

func connect(t *testing.T, addr, id, user, pass string) (*paho.Client, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	cp := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}
	if user != "" {
		cp.Username, cp.UsernameFlag = user, true
		cp.Password, cp.PasswordFlag = []byte(pass), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("connack %d: %w", ca.ReasonCode, err)
		}
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(&paho.Disconnect{}) })
	return c, nil
}

// sent is the test's own record of a reading it published.
type sent struct {
	dev, metric, unit string
	at                time.Time
	v                 float64
}

type winKey struct {
	dev, metric string
	start       time.Time
}

// expected computes the whole-truth statistics of each window from what the
// test sent, with a two-pass algorithm that shares no code with aggregate.
func expected(readings []sent, window time.Duration) map[winKey]aggregate.Summary {
	groups := map[winKey][]sent{}
	var order []winKey
	for _, r := range readings {
		k := winKey{r.dev, r.metric, r.at.Truncate(window).UTC()}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := map[winKey]aggregate.Summary{}
	for _, k := range order {
		g := groups[k]
		s := aggregate.Summary{Gateway: "gw-it", Device: k.dev, Metric: k.metric, Unit: g[0].unit, WindowStart: k.start, WindowEnd: k.start.Add(window),
			Min: math.Inf(1), Max: math.Inf(-1)}
		firstT, lastT := g[0].at, g[0].at
		s.First, s.Last = g[0].v, g[0].v
		for _, r := range g {
			s.Count++
			s.Sum += r.v
			s.Min, s.Max = math.Min(s.Min, r.v), math.Max(s.Max, r.v)
			if r.at.Before(firstT) {
				firstT, s.First = r.at, r.v
			}
			if !r.at.Before(lastT) {
				lastT, s.Last = r.at, r.v
			}
		}
		s.Mean = s.Sum / float64(s.Count)
		var ss float64
		for _, r := range g {
			ss += (r.v - s.Mean) * (r.v - s.Mean)
		}
		s.Stddev = math.Sqrt(ss / float64(s.Count))
		out[k] = s
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func sameStats(got, want aggregate.Summary) bool {
	return got.Gateway == want.Gateway && got.Unit == want.Unit && got.WindowEnd.Equal(want.WindowEnd) &&
		got.Count == want.Count && got.Min == want.Min && got.Max == want.Max && near(got.Sum, want.Sum) &&
		near(got.Mean, want.Mean) && got.First == want.First && got.Last == want.Last && near(got.Stddev, want.Stddev)
}

// TestEndToEnd publishes every payload form at QoS 0 and 1 through a real
// mochi listener with paho clients, and reads the summaries back from kfake
// with a read_committed sarama consumer. Every field of every summary is
// compared with values the test computes from what it sent.
func TestEndToEnd(t *testing.T) {
	_, brokers := kafkatest.Start(t, 3, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	st := startStack(t, cfg, func() time.Time { return t0 })
	addr := st.gw.Addr()
	at := func(s string) time.Time { tt, _ := time.Parse(time.RFC3339Nano, s); return tt }

	var truth []sent
	type pub struct {
		topic, payload string
		qos            byte
		readings       []sent
	}
	pubs := map[string][]pub{
		// bare numbers: arrival time (the injected clock), QoS 1
		"dev-a": {
			{"sensors/dev-a/temp", "20", 1, []sent{{"dev-a", "temp", "", t0, 20}}},
			{"sensors/dev-a/temp", "21.5", 1, []sent{{"dev-a", "temp", "", t0, 21.5}}},
			{"sensors/dev-a/temp", "-3", 1, []sent{{"dev-a", "temp", "", t0, -3}}},
		},
		// {"v","t"} with RFC 3339, Unix ms and seconds, QoS 0
		"dev-b": {
			{"sensors/dev-b/rh", `{"v":40,"t":"2026-11-30T10:00:10Z"}`, 0, []sent{{"dev-b", "rh", "", at("2026-11-30T10:00:10Z"), 40}}},
			{"sensors/dev-b/rh", `{"v":42.5,"t":1796032850500}`, 0, []sent{{"dev-b", "rh", "", at("2026-11-30T10:00:50.5Z"), 42.5}}},
			{"sensors/dev-b/rh", `{"t":1796032870,"v":41,"u":"%RH"}`, 0, []sent{{"dev-b", "rh", "%RH", at("2026-11-30T10:01:10Z"), 41}}},
		},
		// JSON object of metrics with t, QoS 1
		"dev-c": {
			{"sensors/dev-c", `{"t":"2026-11-30T10:02:00Z","temp_c":21.5,"rh":40}`, 1, []sent{
				{"dev-c", "temp_c", "", at("2026-11-30T10:02:00Z"), 21.5}, {"dev-c", "rh", "", at("2026-11-30T10:02:00Z"), 40}}},
			{"sensors/dev-c", `{"temp_c":22.5,"rh":44,"t":"2026-11-30T10:02:30Z"}`, 1, []sent{
				{"dev-c", "temp_c", "", at("2026-11-30T10:02:30Z"), 22.5}, {"dev-c", "rh", "", at("2026-11-30T10:02:30Z"), 44}}},
		},
		// SenML pack with base name/time/unit and a relative time, QoS 1
		"dev-d": {
			{"sensors/dev-d", `[{"bn":"urn:dev:d:","bt":1796032920,"bu":"Cel","n":"temp","v":19},{"n":"temp","t":15,"v":20.5},{"n":"p","u":"Pa","v":101325},{"n":"temp","t":-1e9,"v":1}]`, 1, nil},
		},
		// late data: rev 0 of 10:02 closes when 10:04 arrives; a late reading revises it
		"dev-e": {
			{"sensors/dev-e/t", `{"v":1,"t":"2026-11-30T10:02:10Z"}`, 1, []sent{{"dev-e", "t", "", at("2026-11-30T10:02:10Z"), 1}}},
			{"sensors/dev-e/t", `{"v":2,"t":"2026-11-30T10:02:20Z"}`, 1, []sent{{"dev-e", "t", "", at("2026-11-30T10:02:20Z"), 2}}},
			{"sensors/dev-e/t", `{"v":5,"t":"2026-11-30T10:04:00Z"}`, 1, []sent{{"dev-e", "t", "", at("2026-11-30T10:04:00Z"), 5}}},
			{"sensors/dev-e/t", `{"v":3,"t":"2026-11-30T10:02:50Z"}`, 1, []sent{{"dev-e", "t", "", at("2026-11-30T10:02:50Z"), 3}}},
		},
		// refused: not a number, too far in the future, too late, NaN; and a topic that is not a reading
		"dev-f": {
			{"sensors/dev-f/t", `{"v":1,"t":"2026-11-30T10:05:00Z"}`, 1, []sent{{"dev-f", "t", "", at("2026-11-30T10:05:00Z"), 1}}},
			{"sensors/dev-f/t", "hot", 1, nil},
			{"sensors/dev-f/t", `{"v":1,"t":"2026-11-30T10:08:00Z"}`, 1, nil},
			{"sensors/dev-f/t", `{"v":1,"t":"2026-11-30T08:00:00Z"}`, 1, nil},
			{"sensors/dev-f/t", "NaN", 0, nil},
			{"devices/dev-f/status", "online", 1, nil},
		},
	}
	// SenML records resolved by hand from RFC 8428: bt 1796032920 is
	// 10:02:00; the last record's bt + t = 796032920 is not below 2^28, so
	// it is an absolute time, in 1995: before any real reading, so a clock
	// that was never set, and the reading is stamped on arrival (the
	// injected clock, taken as synchronized).
	pubs["dev-d"][0].readings = []sent{
		{"dev-d", "temp", "Cel", at("2026-11-30T10:02:00Z"), 19},
		{"dev-d", "temp", "Cel", at("2026-11-30T10:02:15Z"), 20.5},
		{"dev-d", "p", "Pa", at("2026-11-30T10:02:00Z"), 101325},
		{"dev-d", "temp", "Cel", t0, 1},
	}

	var wg sync.WaitGroup
	for dev, list := range pubs {
		c, err := connect(t, addr, dev, "", "")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list {
			truth = append(truth, p.readings...)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range list {
				if _, err := c.Publish(context.Background(), &paho.Publish{Topic: p.topic, QoS: p.qos, Payload: []byte(p.payload)}); err != nil {
					t.Errorf("%s publish %s: %v", dev, p.topic, err)
				}
			}
		}()
	}
	wg.Wait()
	// QoS 0 publications have no acknowledgement: wait until the gateway has
	// seen all reading-topic publications (all but the status topic).
	wantPubs := uint64(0)
	for _, list := range pubs {
		wantPubs += uint64(len(list))
	}
	wantPubs--
	deadline := time.Now().Add(patience)
	for st.gw.Stats().Publishes < wantPubs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// dev-e's order matters: it published serially, so its late reading came last.
	st.stopGW() // closes every open window
	stats := st.gw.Stats()

	want := expected(truth, time.Minute)
	// Summaries: one per window, plus one revision for dev-e 10:02.
	msgs := kafkatest.Consume(t, brokers, summariesTopic, len(want)+1, 20*time.Second)
	highest := map[winKey]aggregate.Summary{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatalf("summary %s: %v", m.Value, err)
		}
		k := winKey{s.Device, s.Metric, s.WindowStart.UTC()}
		if prev, ok := highest[k]; ok && prev.Revision >= s.Revision {
			t.Errorf("%v: revision %d after %d", k, s.Revision, prev.Revision)
		}
		highest[k] = s
		if s.ID != aggregate.SummaryID(s.Gateway, s.Device, s.Metric, s.WindowStart, s.Revision) {
			t.Errorf("%v: id %s is not deterministic", k, s.ID)
		}
		if string(m.Key) != "gw-it/"+s.Device {
			t.Errorf("key %q for device %s", m.Key, s.Device)
		}
	}
	if len(msgs) != len(want)+1 {
		t.Errorf("%d summaries, want %d windows + 1 revision", len(msgs), len(want))
	}
	for k, w := range want {
		g, ok := highest[k]
		if !ok {
			t.Errorf("missing window %v", k)
			continue
		}
		if !sameStats(g, w) {
			t.Errorf("%v:\n got %+v\nwant %+v", k, g, w)
		}
	}
	for k := range highest {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected window %v", k)
		}
	}
	e := highest[winKey{"dev-e", "t", at("2026-11-30T10:02:00Z")}]
	if e.Revision != 1 || e.Late != 1 {
		t.Errorf("dev-e 10:02: revision %d late %d, want 1 and 1", e.Revision, e.Late)
	}

	// Dead letters: "hot", the future reading, the too-late reading and
	// NaN: each with its reason.
	dl := kafkatest.Consume(t, brokers, deadTopic, 4, 20*time.Second)
	var reasons []string
	for _, m := range dl {
		var d map[string]any
		if err := json.Unmarshal(m.Value, &d); err != nil {
			t.Fatalf("dead letter %s: %v", m.Value, err)
		}
		reasons = append(reasons, fmt.Sprint(d["device"], ":", d["reason"]))
	}
	sort.Strings(reasons)
	if got, w := strings.Join(reasons, " "), "dev-f:future dev-f:non_finite dev-f:not_a_number dev-f:too_late"; got != w {
		t.Errorf("dead letters = %s, want %s", got, w)
	}
	// Every reading is accounted for in exactly one counter.
	o := stats.Outcomes
	if o["aggregated"] != uint64(len(truth)-1) || o["late_revised"] != 1 || o["too_late"] != 1 || o["future"] != 1 {
		t.Errorf("outcomes %v, want %d aggregated, 1 revised, 1 too late, 1 future", o, len(truth)-1)
	}
	if stats.Rejected["not_a_number"] != 1 || stats.Rejected["non_finite"] != 1 {
		t.Errorf("rejected %v", stats.Rejected)
	}
}

func TestAuthentication(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	cfg.MQTT.AllowAnonymous = false
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MQTT.UsersFile = filepath.Join(t.TempDir(), "users")
	os.WriteFile(cfg.MQTT.UsersFile, []byte("# devices\ndev-1:"+string(hash)+"\n"), 0o600)
	st := startStack(t, cfg, time.Now)
	for name, tc := range map[string]struct {
		user, pass string
		ok         bool
	}{
		"right password":  {"dev-1", "s3cret", true},
		"again (cached)":  {"dev-1", "s3cret", true},
		"wrong password":  {"dev-1", "nope", false},
		"unknown user":    {"dev-2", "s3cret", false},
		"anonymous":       {"", "", false},
		"cached then bad": {"dev-1", "s3cret ", false},
	} {
		t.Run(name, func(t *testing.T) {
			// A device's client id is its name, ':' and anything.
			_, err := connect(t, st.gw.Addr(), tc.user+":"+strings.ReplaceAll(name, " ", "-"), tc.user, tc.pass)
			if (err == nil) != tc.ok {
				t.Errorf("connect err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestLoadUsersErrors(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ content, want string }{
		"no colon":   {"dev-1\n", ":1: want username:bcrypt-hash"},
		"not bcrypt": {"dev-1:plaintext\n", `:1: user "dev-1": not a bcrypt hash`},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		os.WriteFile(p, []byte(tc.content), 0o600)
		if _, err := auth.LoadUsers(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}

// TestRoutingStillWorks checks that readings still reach local subscribers,
// and retained publications are kept, although the gateway tells mochi to
// skip routing when nobody is subscribed.
func TestRoutingStillWorks(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, summariesTopic, deadTopic, "edge.offsets")
	st := startStack(t, testConfig(t, brokers), time.Now)
	addr := st.gw.Addr()
	dev, err := connect(t, addr, "dev-r", "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Retained, with no subscriber yet: must be kept for later subscribers.
	if _, err := dev.Publish(ctx, &paho.Publish{Topic: "sensors/dev-r/state", QoS: 1, Retain: true, Payload: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	// Not retained, no subscriber: acknowledged, goes nowhere.
	if _, err := dev.Publish(ctx, &paho.Publish{Topic: "sensors/dev-r/temp", QoS: 1, Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 10)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	sub := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "dashboard", OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(p paho.PublishReceived) (bool, error) {
			got <- p.Packet.Topic + "=" + string(p.Packet.Payload)
			return true, nil
		},
	}})
	if _, err := sub.Connect(ctx, &paho.Connect{ClientID: "dashboard", KeepAlive: 30, CleanStart: true}); err != nil {
		t.Fatal(err)
	}
	defer sub.Disconnect(&paho.Disconnect{})
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "sensors/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.Publish(ctx, &paho.Publish{Topic: "sensors/dev-r/temp", QoS: 1, Payload: []byte("3")}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	timeout := time.After(patience)
	for len(seen) < 2 {
		select {
		case m := <-got:
			seen = append(seen, m)
		case <-timeout:
			t.Fatalf("subscriber saw %v, want the retained state and the new reading", seen)
		}
	}
	sort.Strings(seen)
	if strings.Join(seen, " ") != "sensors/dev-r/state=1 sensors/dev-r/temp=3" {
		t.Errorf("subscriber saw %v", seen)
	}
	if n := settled(t, st.gw, func(s gateway.Stats) bool { return s.Outcomes["aggregated"] >= 3 }).Outcomes["aggregated"]; n != 3 {
		t.Errorf("aggregated %d readings, want 3", n)
	}
}

// switchOutput counts what it is given and reports Full when told to.
type switchOutput struct {
	full               atomic.Bool
	summaries, letters atomic.Int64
}

func (o *switchOutput) Summary(aggregate.Summary, gateway.Mark)     { o.summaries.Add(1) }
func (o *switchOutput) DeadLetter(gateway.DeadLetter, gateway.Mark) { o.letters.Add(1) }
func (o *switchOutput) Full() bool                                  { return o.full.Load() }
func (o *switchOutput) Stored() gateway.Mark                        { return gateway.Mark{} }
func (o *switchOutput) Sync() error                                 { return nil }

// TestBackpressure: while the output is full, QoS 1 readings from an MQTT 5
// device get PUBACK 0x97 (quota exceeded) and are neither aggregated nor
// dead-lettered; QoS 0 readings are still taken; when room returns, QoS 1
// readings are acknowledged again.
func TestBackpressure(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	out := &switchOutput{}
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), out, quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { gw.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	c, err := connect(t, gw.Addr(), "dev-bp", "", "")
	if err != nil {
		t.Fatal(err)
	}
	out.full.Store(true)
	pr, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-bp/t", QoS: 1, Payload: []byte("1")})
	if err == nil || pr == nil || pr.ReasonCode != 0x97 {
		t.Fatalf("publish while full: %+v, %v; want reason 0x97", pr, err)
	}
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-bp/t", QoS: 0, Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	out.full.Store(false)
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-bp/t", QoS: 1, Payload: []byte("3")}); err != nil {
		t.Fatalf("publish with room: %v", err)
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Outcomes["aggregated"] >= 2 })
	if st.Refused != 1 || st.Outcomes["aggregated"] != 2 || out.letters.Load() != 0 {
		t.Errorf("refused %d, aggregated %d, dead letters %d; want 1, 2, 0", st.Refused, st.Outcomes["aggregated"], out.letters.Load())
	}
}

// rawClient speaks MQTT 5 with packets it builds itself, so a test can set
// the DUP flag and packet ids as a device resending after a restart does.
type rawClient struct {
	t    *testing.T
	conn net.Conn
}

// rawConnect connects with a persistent session (or a clean start) and
// returns whether the CONNACK says the session was present.
func rawConnect(t *testing.T, addr, id string, clean bool) (*rawClient, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cp := packets.NewControlPacket(packets.CONNECT)
	cp.Content = &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: clean, KeepAlive: 30,
		Properties: &packets.Properties{SessionExpiryInterval: ptr(uint32(3600))}}
	if _, err := cp.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(patience))
	resp, err := packets.ReadPacket(conn)
	if err != nil {
		t.Fatal(err)
	}
	ca, ok := resp.Content.(*packets.Connack)
	if !ok || ca.ReasonCode != 0 {
		t.Fatalf("connect: %v", resp)
	}
	return &rawClient{t, conn}, ca.SessionPresent
}

func ptr[T any](v T) *T { return &v }

// runGateway starts a gateway on cfg with an output that only counts, and
// returns it with a function that stops it (requiring a clean stop). A
// test calls it again on the same data directory to restart.
func runGateway(t testing.TB, cfg *configs.Config) (*gateway.Gateway, func()) {
	t.Helper()
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), &switchOutput{}, quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	return gw, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	}
}

// patience is how long a test waits for what comes unless the gateway
// hangs: a reply, a count, a closed connection. It is not a measure of
// speed: a loaded machine (the race detector, two cores, the suite's
// packages in parallel) may take seconds over what takes milliseconds.
const patience = 30 * time.Second

// settled polls the gateway's counters until ok holds, for at most
// patience, and returns them: a reading is applied shortly after its
// PUBACK.
func settled(t *testing.T, gw *gateway.Gateway, ok func(gateway.Stats) bool) gateway.Stats {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		st := gw.Stats()
		if ok(st) || time.Now().After(deadline) {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// send writes a packet.
func (c *rawClient) send(cp *packets.ControlPacket) {
	c.t.Helper()
	if _, err := cp.WriteTo(c.conn); err != nil {
		c.t.Fatal(err)
	}
}

// expect reads the next packet and requires its type and packet id; it
// returns the reason code.
func (c *rawClient) expect(typ byte, pid uint16) byte {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(patience))
	resp, err := packets.ReadPacket(c.conn)
	if err != nil {
		c.t.Fatalf("waiting for %s %d: %v", packets.NewControlPacket(typ).PacketType(), pid, err)
	}
	if resp.Type != typ || resp.PacketID() != pid {
		c.t.Fatalf("got %v, want %s %d", resp, packets.NewControlPacket(typ).PacketType(), pid)
	}
	switch p := resp.Content.(type) {
	case *packets.Pubrec:
		return p.ReasonCode
	case *packets.Pubcomp:
		return p.ReasonCode
	}
	return 0
}

// publish sends a QoS 1 publication and returns the PUBACK's reason code.
func (c *rawClient) publish(pid uint16, dup bool, topic, payload string) byte {
	c.t.Helper()
	cp := packets.NewControlPacket(packets.PUBLISH)
	cp.Content = &packets.Publish{QoS: 1, PacketID: pid, Duplicate: dup, Topic: topic, Payload: []byte(payload), Properties: &packets.Properties{}}
	if _, err := cp.WriteTo(c.conn); err != nil {
		c.t.Fatal(err)
	}
	c.conn.SetReadDeadline(time.Now().Add(patience))
	resp, err := packets.ReadPacket(c.conn)
	if err != nil {
		c.t.Fatal(err)
	}
	ack, ok := resp.Content.(*packets.Puback)
	if !ok || ack.PacketID != pid {
		c.t.Fatalf("publish %d: got %v", pid, resp)
	}
	return ack.ReasonCode
}

// TestRedeliveryAcrossRestart: a QoS 1 resend (DUP, same packet id and
// payload) of a journaled reading is acknowledged but not counted again,
// before and after a restart; the persistent session survives the restart
// (CONNACK session present); a DUP with other content, or a new packet id,
// counts.
func TestRedeliveryAcrossRestart(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	start := func() (*gateway.Gateway, func()) { return runGateway(t, cfg) }
	const topic = "sensors/dev-r/t"
	gw, stop := start()
	c, present := rawConnect(t, gw.Addr(), "dev-r", true)
	if present {
		t.Error("first connection: session present")
	}
	c.publish(7, false, topic, "21.5")
	c.publish(7, true, topic, "21.5") // PUBACK lost, say: resent
	c.publish(8, false, topic, "21.5")
	// Other content: a different reading. The connection is gone before
	// its PUBACK is written: the client never has it.
	cp := packets.NewControlPacket(packets.PUBLISH)
	cp.Content = &packets.Publish{QoS: 1, PacketID: 8, Duplicate: true, Topic: topic, Payload: []byte("99"), Properties: &packets.Properties{}}
	c.send(cp)
	c.conn.Close()
	// Readings are applied in journal order, so once the last one counts,
	// every one before it has been seen.
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	st := settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 3 })
	if st.Outcomes["aggregated"] != 3 || st.Duplicates != 1 || st.Sessions != 1 {
		t.Errorf("aggregated %d, duplicates %d, sessions %d; want 3, 1, 1", st.Outcomes["aggregated"], st.Duplicates, st.Sessions)
	}
	stop()

	gw, stop = start()
	defer stop()
	c, present = rawConnect(t, gw.Addr(), "dev-r", false)
	if !present {
		t.Error("after restart: CONNACK says no session present")
	}
	c.publish(8, true, topic, "99") // resent after the restart
	c.publish(9, false, topic, "99")
	// Windows were closed at shutdown: later readings revise them.
	st = settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 4 })
	if counted(st) != 4 || st.Duplicates != 1 {
		t.Errorf("after restart: counted %d (all time), duplicates %d; want 4, 1 (%v)", counted(st), st.Duplicates, st.Outcomes)
	}
	// A clean start ends the session and what was known of its packets.
	c.conn.Close()
	c, present = rawConnect(t, gw.Addr(), "dev-r", true)
	if present {
		t.Error("clean start: session present")
	}
	c.publish(9, true, topic, "99")
	if st := settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 5 }); counted(st) != 5 || st.Duplicates != 1 {
		t.Errorf("after clean start: counted %d, duplicates %d; want 5, 1", counted(st), st.Duplicates)
	}
}

// TestIdleGatewayWritesNothing: with no readings, no tick is journaled
// (an SD card is not written every second for nothing).
func TestIdleGatewayWritesNothing(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), &switchOutput{}, quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	time.Sleep(2200 * time.Millisecond) // two ticks
	st := gw.Stats()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st.Journal.Applied != 0 {
		t.Errorf("idle gateway journaled %d events", st.Journal.Applied)
	}
}

// TestDataDirInUse: a second gateway on the same data directory is refused
// with a clear error instead of corrupting the first one's state.
func TestDataDirInUse(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), &switchOutput{}, quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	defer func() { cancel(); <-done }()
	_, err = gateway.New(cfg.GatewayOptions(i2creg.Open), &switchOutput{}, quietLog(), time.Now)
	if err == nil || !strings.Contains(err.Error(), "another edgegate") {
		t.Errorf("second gateway on the same data_dir: %v", err)
	}
}

// TestQoS2AcrossRestart: a QoS 2 publication whose PUBREC was sent before
// a restart is completed after it: the gateway resends the PUBREC when the
// session resumes and answers the PUBREL with PUBCOMP (success, not
// "packet identifier not found"); the reading counts once.
func TestQoS2AcrossRestart(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	start := func() (*gateway.Gateway, func()) { return runGateway(t, cfg) }
	gw, stop := start()
	c, _ := rawConnect(t, gw.Addr(), "dev-q2", true)
	pub := packets.NewControlPacket(packets.PUBLISH)
	pub.Content = &packets.Publish{QoS: 2, PacketID: 5, Topic: "sensors/dev-q2/t", Payload: []byte("7"), Properties: &packets.Properties{}}
	c.send(pub)
	if rc := c.expect(packets.PUBREC, 5); rc != 0 {
		t.Fatalf("PUBREC reason %#x", rc)
	}
	c.conn.Close() // the PUBREL never left: the gateway goes down first
	stop()

	gw, stop = start()
	defer stop()
	c, present := rawConnect(t, gw.Addr(), "dev-q2", false)
	if !present {
		t.Fatal("session not present after the restart")
	}
	if rc := c.expect(packets.PUBREC, 5); rc != 0 { // resent on resume
		t.Fatalf("resent PUBREC reason %#x", rc)
	}
	rel := packets.NewControlPacket(packets.PUBREL)
	rel.Content = &packets.Pubrel{PacketID: 5, Properties: &packets.Properties{}}
	c.send(rel)
	if rc := c.expect(packets.PUBCOMP, 5); rc != 0 {
		t.Errorf("PUBCOMP reason %#x, want success", rc)
	}
	// Done: a later PUBREL for it is unknown, and the reading counted once.
	c.send(rel)
	if rc := c.expect(packets.PUBCOMP, 5); rc != 0x92 {
		t.Errorf("second PUBREL: PUBCOMP reason %#x, want 0x92 (not found)", rc)
	}
	st := gw.Stats()
	if n := st.Outcomes["aggregated"] + st.Outcomes["late_revised"]; n != 1 {
		t.Errorf("counted %d readings, want 1", n)
	}
}

// TestSensorsEndToEnd runs the gateway with an emulated I²C bus holding a
// BME280, an SHT3x and a BH1750, polled every 100 ms, and reads the
// summaries back from kfake: per metric, the readings counted are the
// chips' own count of measurements, and sum, min and max are those of the
// values the test scripted. A local subscriber sees the readings too.
func TestSensorsEndToEnd(t *testing.T) {
	bus := chips.NewBus("edgegate-test-i2c")
	bme, sht, bh := chips.NewBME280(), chips.NewSHT3x(), chips.NewBH1750()
	bus.Attach(0x76, bme)
	bus.Attach(0x44, sht)
	bus.Attach(0x23, bh)
	if err := i2creg.Register(bus.String(), nil, -1, func() (i2c.BusCloser, error) { return bus, nil }); err != nil {
		t.Fatal(err)
	}
	defer i2creg.Unregister(bus.String())
	// The BME280 walks 20.00, 20.25, … °C and 100000, 100010, … Pa; the
	// others hold still.
	temp := func(n int) float64 { return 20 + 0.25*float64(n%16) }
	pres := func(n int) float64 { return 100000 + 10*float64(n%16) }
	bme.Script(func(n int) (float64, float64, float64) { return temp(n), pres(n), 55 })
	sht.Set(18.5, 40)
	bh.Set(250)

	_, brokers := kafkatest.Start(t, 3, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	cfg.Sensors = []configs.Sensor{
		{Bus: bus.String(), Address: 0x76, Driver: "bme280", Every: configs.Duration(100 * time.Millisecond), Device: "board", Metrics: map[string]string{"temperature": "temp_c"}},
		{Bus: bus.String(), Address: 0x44, Driver: "sht3x", Every: configs.Duration(100 * time.Millisecond), Device: "board-sht"},
		{Bus: bus.String(), Address: 0x23, Driver: "bh1750", Every: configs.Duration(100 * time.Millisecond), Device: "board"},
		{Bus: bus.String(), Address: 0x45, Driver: "sht3x", Every: configs.Duration(100 * time.Millisecond), Device: "missing"},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, cfg, time.Now)
	sub, err := connect(t, st.gw.Addr(), "local-sub", "", "")
	if err != nil {
		t.Fatal(err)
	}
	local := make(chan string, 100)
	sub.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		select {
		case local <- pr.Packet.Topic + " " + string(pr.Packet.Payload):
		default:
		}
		return true, nil
	})
	if _, err := sub.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "sensors/board/temp_c", QoS: 0}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-local:
		if !strings.HasPrefix(m, `sensors/board/temp_c {"v":`) || !strings.HasSuffix(m, `,"u":"Cel"}`) {
			t.Errorf("local subscriber got %s", m)
		}
	case <-time.After(patience):
		t.Error("no sensor reading on the local broker")
	}
	// Until each chip has measured at least 5 times (half a second or so:
	// a BH1750 measurement takes 180 ms) and the missing one has failed;
	// a loaded machine polls less often, not less well.
	missing := func(status []sensors.Status) (m sensors.Status) {
		for _, s := range status {
			if s.Device == "missing" {
				m = s
			}
		}
		return m
	}
	var status []sensors.Status
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		status = st.gw.Stats().Sensors
		if bme.Count() >= 5 && sht.Count() >= 5 && bh.Count() >= 5 && missing(status).Errors > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: measurements: bme280 %d, sht3x %d, bh1750 %d; want 5 each; missing sensor %+v",
				patience, bme.Count(), sht.Count(), bh.Count(), missing(status))
		}
	}
	st.stopGW() // closes every open window
	nBME, nSHT, nBH := bme.Count(), sht.Count(), bh.Count()
	if m := missing(status); m.Up || m.Errors == 0 || !strings.Contains(m.LastError, "sht3x at 0x45") {
		t.Errorf("missing sensor status: %+v", m)
	}

	type agg struct {
		n             int64
		sum, min, max float64
		unit          string
	}
	want := map[string]agg{}
	add := func(k, unit string, v float64) {
		a, ok := want[k]
		if !ok {
			a = agg{min: v, max: v, unit: unit}
		}
		a.n++
		a.sum += v
		a.min, a.max = math.Min(a.min, v), math.Max(a.max, v)
		want[k] = a
	}
	for n := range nBME {
		add("board/temp_c", "Cel", temp(n))
		add("board/pressure", "Pa", pres(n))
		add("board/humidity", "%RH", 55)
	}
	for range nSHT {
		add("board-sht/temperature", "Cel", 18.5)
		add("board-sht/humidity", "%RH", 40)
	}
	for range nBH {
		add("board/illuminance", "lx", 250)
	}
	// Every summary the gateway emitted, however long the forwarder takes
	// to deliver them (a surplus shows too).
	got := map[string]agg{}
	msgs := kafkatest.Consume(t, brokers, summariesTopic, int(st.gw.Stats().Summaries), 2*patience)
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatal(err)
		}
		k := s.Device + "/" + s.Metric
		a, ok := got[k]
		if !ok {
			a = agg{min: s.Min, max: s.Max, unit: s.Unit}
		}
		a.n += s.Count
		a.sum += s.Sum
		a.min, a.max = math.Min(a.min, s.Min), math.Max(a.max, s.Max)
		got[k] = a
	}
	// The chips quantise: the BME280 to 0.01 °C, 1/256 Pa and 1/1024 %RH
	// steps, the SHT3x to 175/65535 °C and 100/65535 %RH, the BH1750 to
	// 1/1.2 lx; the scripted values are chosen to be near those steps.
	tol := map[string]float64{"board/pressure": 0.5, "board/humidity": 0.02, "board-sht/temperature": 0.003, "board-sht/humidity": 0.002, "board/illuminance": 0.84}
	for k, w := range want {
		g, ok := got[k]
		e := tol[k] + 1e-9
		if !ok || g.n != w.n || g.unit != w.unit || math.Abs(g.sum-w.sum) > e*float64(w.n) || math.Abs(g.min-w.min) > e || math.Abs(g.max-w.max) > e {
			t.Errorf("%s: got %+v, want %+v", k, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("metrics in Kafka %v, want %v", got, want)
	}
}

// TestSubscriptionsSurviveRestart: a local subscriber with a persistent
// session finds its subscription in place after a gateway restart (CONNACK
// says session present, so it does not subscribe again) and receives a
// device's reading.
func TestSubscriptionsSurviveRestart(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	start := func() (*gateway.Gateway, func()) { return runGateway(t, cfg) }
	gw, stop := start()
	sub, _ := rawConnect(t, gw.Addr(), "dashboard", true)
	sp := packets.NewControlPacket(packets.SUBSCRIBE)
	sp.Content = &packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: "sensors/dev-s/#", QoS: 1}}, Properties: &packets.Properties{}}
	sub.send(sp)
	sub.expect(packets.SUBACK, 1)
	sub.conn.Close()
	stop()

	gw, stop = start()
	defer stop()
	sub, present := rawConnect(t, gw.Addr(), "dashboard", false)
	if !present {
		t.Fatal("session not present after the restart")
	}
	dev, err := connect(t, gw.Addr(), "dev-s", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dev.Publish(context.Background(), &paho.Publish{Topic: "sensors/dev-s/t", QoS: 1, Payload: []byte("5")}); err != nil {
		t.Fatal(err)
	}
	sub.conn.SetReadDeadline(time.Now().Add(patience))
	got, err := packets.ReadPacket(sub.conn)
	if err != nil {
		t.Fatalf("subscriber after the restart: %v", err)
	}
	if p, ok := got.Content.(*packets.Publish); !ok || p.Topic != "sensors/dev-s/t" || string(p.Payload) != "5" {
		t.Errorf("subscriber got %v", got)
	}
}

// TestOfflineSubscriberGetsQueued: a QoS 1 message for a persistent
// session whose client is away waits for it, and arrives when it
// reconnects.
func TestOfflineSubscriberGetsQueued(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	sub, _ := rawConnect(t, gw.Addr(), "dashboard", true)
	sp := packets.NewControlPacket(packets.SUBSCRIBE)
	sp.Content = &packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: "sensors/dev-q/#", QoS: 1}}, Properties: &packets.Properties{}}
	sub.send(sp)
	sub.expect(packets.SUBACK, 1)
	sub.conn.Close()
	// The broker sees the disconnect: the message is then queued for the
	// session, not written to the closed connection.
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.Clients == 0 }); st.Clients != 0 {
		t.Fatalf("%d clients connected after the subscriber left, want 0", st.Clients)
	}
	dev, err := connect(t, gw.Addr(), "dev-q", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dev.Publish(context.Background(), &paho.Publish{Topic: "sensors/dev-q/t", QoS: 1, Payload: []byte("7")}); err != nil {
		t.Fatal(err)
	}
	sub, present := rawConnect(t, gw.Addr(), "dashboard", false)
	if !present {
		t.Fatal("session not present")
	}
	sub.conn.SetReadDeadline(time.Now().Add(patience))
	got, err := packets.ReadPacket(sub.conn)
	if err != nil {
		t.Fatalf("queued message: %v", err)
	}
	if p, ok := got.Content.(*packets.Publish); !ok || p.Topic != "sensors/dev-q/t" || string(p.Payload) != "7" {
		t.Errorf("subscriber got %v", got)
	}
}

// TestBadUsersFileTouchesNothing: a users file that does not load stops
// the start before the journal and the state file are opened (recovery
// would truncate a torn journal tail and replay it for nothing).
func TestBadUsersFileTouchesNothing(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	bad := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(bad, []byte("dev:not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.MQTT.UsersFile = bad
	if _, err := gateway.New(cfg.GatewayOptions(i2creg.Open), &switchOutput{}, quietLog(), time.Now); err == nil || !strings.Contains(err.Error(), "mqtt.users_file") {
		t.Fatalf("New = %v, want a mqtt.users_file error", err)
	}
	for _, d := range []string{"ingest", "state"} {
		if _, err := os.Stat(filepath.Join(cfg.Gateway.DataDir, d)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it not created", d, err)
		}
	}
}
