package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"periph.io/x/conn/v3/i2c/i2creg"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
)

// countingOutput counts what the gateway hands to the real forwarder's
// Output behind it.
type countingOutput struct {
	gateway.Output
	summaries, letters atomic.Int64
}

func (o *countingOutput) Summary(s aggregate.Summary, m gateway.Mark) {
	o.summaries.Add(1)
	o.Output.Summary(s, m)
}

func (o *countingOutput) DeadLetter(d gateway.DeadLetter, m gateway.Mark) {
	o.letters.Add(1)
	o.Output.DeadLetter(d, m)
}

// startCounted runs a gateway on cfg with a real forwarder (queue quota
// maxBytes) delivering to cfg's brokers, behind a countingOutput.
func startCounted(t *testing.T, cfg *configs.Config, maxBytes int64) (*gateway.Gateway, *bridge.Forwarder, *countingOutput) {
	t.Helper()
	log := quietLog()
	fwd, err := bridge.NewForwarder(bridge.Options{Gateway: cfg.Gateway.ID, SummariesTopic: cfg.Kafka.SummariesTopic,
		DeadletterTopic: cfg.Kafka.DeadletterTopic, Logger: log, Dir: t.TempDir(), MaxBytes: maxBytes},
		kafka.NewConnector(kafka.Options{Brokers: cfg.Kafka.Brokers, ClientID: "it",
			TransactionalID: cfg.TransactionalID(), OffsetsTopic: cfg.Kafka.OffsetsTopic, PositionKey: cfg.Gateway.ID}))
	if err != nil {
		t.Fatal(err)
	}
	out := &countingOutput{Output: output.Forwarder(fwd)}
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), out, log, func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := gw.Run(ctx); err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	fctx, fcancel := context.WithCancel(context.Background())
	var fwg sync.WaitGroup
	fwg.Go(func() {
		if err := fwd.Run(fctx); err != nil {
			t.Errorf("forwarder: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait(); fcancel(); fwg.Wait() })
	return gw, fwd, out
}

// deadLetterJSON is the dead-letter record as a consumer reads it.
type deadLetterJSON struct {
	Reason        string `json:"reason"`
	Device        string `json:"device"`
	Payload       string `json:"payload"`
	PayloadBytes  int    `json:"payload_bytes"`
	PayloadSHA256 string `json:"payload_sha256"`
	Reasons       []struct {
		Reason string `json:"reason"`
		Count  int    `json:"count"`
	} `json:"reasons"`
	Items      []json.RawMessage `json:"items"`
	ItemsTotal int               `json:"items_total"`
}

// TestOnePublicationOneDeadLetter publishes a 60 KB JSON object with
// thousands of non-numeric fields, a bad metric name, a number out of
// range and ten good metrics: the good ones are aggregated, and the
// rest makes exactly one dead letter, of bounded size, with every reason
// and its count, and the payload once (cut, with its length and hash).
func TestOnePublicationOneDeadLetter(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	gw, fwd, out := startCounted(t, cfg, 64<<20)
	c, err := connect(t, gw.Addr(), "dev-big", "", "")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString(`{"bad_v":{"v":1},"bad/name":1,"huge":1e999`)
	for i := range 10 {
		fmt.Fprintf(&b, `,"m%d":%d`, i, i)
	}
	strs := 0
	for b.Len() < 60_000 {
		fmt.Fprintf(&b, `,"s%04d":"x"`, strs)
		strs++
	}
	b.WriteString("}")
	body := b.String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-big", QoS: 1, Payload: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	// A second, undecodable publication from another device: its dead
	// letter is the second record, so a surplus from the first shows.
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-two/t", QoS: 1, Payload: []byte("hot")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return gw.Stats().Publishes == 2 })
	if n := out.letters.Load(); n != 2 {
		t.Fatalf("two publications made %d dead letters, want 2 (one each)", n)
	}
	msgs := kafkatest.Consume(t, brokers, deadTopic, 2, 20*time.Second)
	if len(msgs) != 2 {
		t.Fatalf("%d dead-letter records, want 2", len(msgs))
	}
	var d deadLetterJSON
	if err := json.Unmarshal(msgs[0].Value, &d); err != nil {
		t.Fatal(err)
	}
	t.Logf("dead letter of a %d-byte publication: %d bytes", len(body), len(msgs[0].Value))
	if len(msgs[0].Value) > 16<<10 {
		t.Errorf("dead letter of a %d-byte publication is %d bytes, want at most 16 KiB", len(body), len(msgs[0].Value))
	}
	got := map[string]int{}
	for _, r := range d.Reasons {
		got[r.Reason] = r.Count
	}
	want := map[string]int{"unsupported_value": strs + 1, "bad_name": 1, "number_out_of_range": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reasons %v, want %v", got, want)
	}
	if d.Reason != "unsupported_value" || d.Device != "dev-big" || d.ItemsTotal != strs+3 || len(d.Items) != gateway.MaxDeadItems {
		t.Errorf("reason %q device %q items_total %d items %d, want unsupported_value dev-big %d %d",
			d.Reason, d.Device, d.ItemsTotal, len(d.Items), strs+3, gateway.MaxDeadItems)
	}
	if d.PayloadBytes != len(body) || len(d.Payload) != gateway.DefaultDeadLetterPayload || !strings.HasPrefix(body, d.Payload) {
		t.Errorf("payload: %d bytes of %d (payload_bytes %d), want the first %d", len(d.Payload), len(body), d.PayloadBytes, gateway.DefaultDeadLetterPayload)
	}
	if d.PayloadSHA256 != sha256Hex(body) {
		t.Errorf("payload_sha256 %s, want %s", d.PayloadSHA256, sha256Hex(body))
	}
	var two deadLetterJSON
	if err := json.Unmarshal(msgs[1].Value, &two); err != nil {
		t.Fatal(err)
	}
	if two.Device != "dev-two" || two.Reason != "not_a_number" || two.Payload != "hot" || two.PayloadBytes != 3 {
		t.Errorf("second dead letter %s", msgs[1].Value)
	}
	if o := gw.Stats().Outcomes; o["aggregated"] != 10 {
		t.Errorf("outcomes %v, want 10 aggregated", o)
	}
	if st := fwd.Stats(); st.Dropped != 0 {
		t.Errorf("forwarder dropped %d records", st.Dropped)
	}
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// waitFor polls cond for up to patience.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", patience)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSeriesLimitThroughGateway publishes one object of 10,000 metrics
// from one device: the first aggregate.max_metrics_per_device (256) are
// aggregated, the other 9,744 end as too_many_series in one dead letter.
func TestSeriesLimitThroughGateway(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	cfg.MQTT.MaxPayload, cfg.MQTT.MaxPacket = 256<<10, 256<<10
	const metrics, limit = 10_000, 256
	if cfg.Aggregate.MaxMetricsPerDevice != limit {
		t.Fatalf("aggregate.max_metrics_per_device defaults to %d; this test expects %d", cfg.Aggregate.MaxMetricsPerDevice, limit)
	}
	var b strings.Builder
	b.WriteString("{")
	for i := range metrics {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"m%05d":%d`, i, i)
	}
	b.WriteString("}")
	check := func(gw *gateway.Gateway) {
		t.Helper()
		st := gw.Stats()
		if o := st.Outcomes; o["aggregated"] != limit || o["too_many_series"] != metrics-limit {
			t.Errorf("outcomes %v, want %d aggregated and %d too_many_series", o, limit, metrics-limit)
		}
		if st.Series != limit || st.OpenWindows != limit {
			t.Errorf("%d series, %d open windows; want %d", st.Series, st.OpenWindows, limit)
		}
	}

	gw, _, out := startCounted(t, cfg, 64<<20)
	c, err := connect(t, gw.Addr(), "dev-many", "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/dev-many", QoS: 1, Payload: []byte(b.String())}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return gw.Stats().Publishes == 1 })
	check(gw)
	if n := out.letters.Load(); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	msgs := kafkatest.Consume(t, brokers, deadTopic, 1, 20*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("%d dead-letter records, want 1", len(msgs))
	}
	var d deadLetterJSON
	if err := json.Unmarshal(msgs[0].Value, &d); err != nil {
		t.Fatal(err)
	}
	if d.Reason != "too_many_series" || len(d.Reasons) != 1 || d.Reasons[0].Count != metrics-limit || d.ItemsTotal != metrics-limit ||
		d.Device != "dev-many" || d.Payload != "" {
		t.Errorf("dead letter: reason %q reasons %+v items_total %d device %q payload %d bytes; want too_many_series x %d for dev-many, no payload",
			d.Reason, d.Reasons, d.ItemsTotal, d.Device, len(d.Payload), metrics-limit)
	}
	var first struct {
		Metric string `json:"metric"`
	}
	if err := json.Unmarshal(d.Items[0], &first); err != nil || first.Metric != fmt.Sprintf("m%05d", limit) {
		t.Errorf("first refused item %s, want metric m%05d", d.Items[0], limit)
	}
	_ = c.Disconnect(&paho.Disconnect{})
}

// TestSeriesLimitInReplay journals a publication of 200 metrics and one
// of 10,000 metrics of another device, with aggregate.max_series 300, crashes (no checkpoint, no
// flush) and recovers: the replay meets the same limits, so it holds no
// more series than the run that wrote the journal, and makes no dead
// letter again.
func TestSeriesLimitInReplay(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	const metrics = 10_000
	cfg.Aggregate.MaxSeries = 300
	cfg.MQTT.MaxPayload, cfg.MQTT.MaxPacket = 256<<10, 256<<10
	log := quietLog()
	down := func(context.Context) (bridge.Producer, error) { return nil, errors.New("no kafka") }
	fwdOpts := bridge.Options{Gateway: "gw-it", SummariesTopic: "s", DeadletterTopic: "d", Dir: filepath.Join(cfg.Gateway.DataDir, "outbound"),
		Grace: time.Millisecond, Logger: log}
	payload := func(n int) []byte {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"m%05d":%d`, i, i)
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	open := func() (*gateway.Gateway, *bridge.Forwarder, *countingOutput) {
		fwd, err := bridge.NewForwarder(fwdOpts, down)
		if err != nil {
			t.Fatal(err)
		}
		out := &countingOutput{Output: output.Forwarder(fwd)}
		g, err := gateway.New(cfg.GatewayOptions(nil), out, log, func() time.Time { return t0 })
		if err != nil {
			t.Fatal(err)
		}
		return g, fwd, out
	}
	check := func(when string, g *gateway.Gateway) {
		t.Helper()
		st := g.Stats()
		// dev-1: 200 series; dev-2: 100 of its 10,000 fit under max_series.
		if o := st.Outcomes; o["aggregated"] != 300 || o["too_many_series"] != metrics-100 || st.Series != 300 {
			t.Errorf("%s: outcomes %v, %d series; want 300 aggregated, %d too_many_series, 300 series", when, o, st.Series, metrics-100)
		}
	}
	stopFwd := func(f *bridge.Forwarder) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		f.Run(ctx)
	}

	g, fwd, out := open()
	at := t0.UnixNano()
	var recs [][]byte
	recs = append(recs, journal.AppendPublish(nil, at, 1, 1, "c1", "sensors/dev-1", payload(200)))
	recs = append(recs, journal.AppendPublish(nil, at, 1, 1, "c2", "sensors/dev-2", payload(metrics)))
	for i, r := range recs {
		if _, err := g.JournalLog().Append(r); err != nil {
			t.Fatal(err)
		}
		g.ApplyBatch(uint64(i+1), [][]byte{r})
	}
	if err := g.JournalLog().Sync(); err != nil {
		t.Fatal(err)
	}
	check("first run", g)
	if n := out.letters.Load(); n != 1 {
		t.Errorf("first run: %d dead letters, want 1", n)
	}
	if err := fwd.Sync(); err != nil {
		t.Fatal(err)
	}
	g.CloseFiles() // the crash: no flush, no checkpoint
	stopFwd(fwd)

	g, fwd, out = open()
	defer func() { g.CloseFiles(); stopFwd(fwd) }()
	if g.Replayed() != 2 {
		t.Fatalf("replayed %d events, want 2", g.Replayed())
	}
	check("after replay", g)
	if n := out.letters.Load(); n != 0 {
		t.Errorf("replay made %d dead letters again, want 0 (already queued)", n)
	}
}
