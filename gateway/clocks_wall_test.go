package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
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
)

// wallClock is a wall clock moved by hand, safe for concurrent use.
type wallClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *wallClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *wallClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// restartable is a gateway and forwarder on one data directory and one
// outbound queue, against kfake, that a test stops and starts again.
type restartable struct {
	t       *testing.T
	cfg     *configs.Config
	brokers []string
	outDir  string
	now     func() time.Time
	opts    func(*gateway.Options) // if set, adjusts the options (the clock)
	gw      *gateway.Gateway
	stop    func()
	clients map[string]*paho.Client // by device, until the next restart
}

func newRestartable(t *testing.T, now func() time.Time, opts func(*gateway.Options), tweak func(*configs.Config)) *restartable {
	t.Helper()
	_, brokers := kafkatest.Start(t, 1, summariesTopic, deadTopic, "edge.offsets")
	cfg := testConfig(t, brokers)
	if tweak != nil {
		tweak(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	r := &restartable{t: t, cfg: cfg, brokers: brokers, outDir: filepath.Join(t.TempDir(), "outbound"), now: now, opts: opts}
	r.start()
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *restartable) start() {
	t := r.t
	t.Helper()
	log := quietLog()
	fwd, err := bridge.NewForwarder(bridge.Options{Gateway: r.cfg.Gateway.ID, SummariesTopic: r.cfg.Kafka.SummariesTopic,
		DeadletterTopic: r.cfg.Kafka.DeadletterTopic, Logger: log, Dir: r.outDir},
		kafka.NewConnector(kafka.Options{Brokers: r.brokers, ClientID: "it",
			TransactionalID: r.cfg.TransactionalID(), OffsetsTopic: r.cfg.Kafka.OffsetsTopic, PositionKey: r.cfg.Gateway.ID}))
	if err != nil {
		t.Fatal(err)
	}
	o := r.cfg.GatewayOptions(i2creg.Open)
	if r.opts != nil {
		r.opts(&o)
	}
	gw, err := gateway.New(o, output.Forwarder(fwd), log, r.now)
	if err != nil {
		t.Fatal(err)
	}
	r.gw, r.clients = gw, map[string]*paho.Client{}
	gctx, gcancel := context.WithCancel(context.Background())
	fctx, fcancel := context.WithCancel(context.Background())
	var gwg, fwg sync.WaitGroup
	gwg.Go(func() {
		if err := gw.Run(gctx); err != nil {
			t.Errorf("gateway: %v", err)
		}
	})
	fwg.Go(func() {
		if err := fwd.Run(fctx); err != nil {
			t.Errorf("forwarder: %v", err)
		}
	})
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			for _, c := range r.clients {
				c.Disconnect(&paho.Disconnect{})
			}
			gcancel()
			gwg.Wait()
			// Deliver what the shutdown flushed before stopping the
			// forwarder: its queue survives anyway, but the test reads
			// Kafka.
			for deadline := time.Now().Add(2 * patience); fwd.Stats().Queued > 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			fcancel()
			fwg.Wait()
		})
	}
}

func (r *restartable) restart() {
	r.stop()
	r.start()
}

// publish sends a QoS 1 publication from client dev and returns once the
// gateway has applied it.
func (r *restartable) publish(dev, topic, payload string) {
	t := r.t
	t.Helper()
	c := r.clients[dev]
	if c == nil {
		var err error
		if c, err = connect(t, r.gw.Addr(), dev, "", ""); err != nil {
			t.Fatal(err)
		}
		r.clients[dev] = c
	}
	before := r.gw.Stats().Publishes
	if _, err := c.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)}); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	if st := settled(t, r.gw, func(st gateway.Stats) bool { return st.Publishes > before }); st.Publishes <= before {
		t.Fatalf("publication on %s not applied", topic)
	}
}

// summaries reads n summary records from Kafka (failing the test if they
// do not come within the timeout, or more come), and returns the highest
// revision of each window, by device, metric and window start.
func (r *restartable) summaries(n int, timeout time.Duration) map[winKey]aggregate.Summary {
	r.t.Helper()
	out := map[winKey]aggregate.Summary{}
	msgs := kafkatest.Consume(r.t, r.brokers, summariesTopic, n, timeout)
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			r.t.Fatalf("summary %s: %v", m.Value, err)
		}
		k := winKey{s.Device, s.Metric, s.WindowStart.UTC()}
		if prev, ok := out[k]; ok && prev.Revision >= s.Revision {
			r.t.Errorf("%v: revision %d after %d", k, s.Revision, prev.Revision)
		}
		out[k] = s
	}
	if len(msgs) != n {
		r.t.Errorf("%d summary records, want %d: %v", len(msgs), n, out)
	}
	return out
}

func (k winKey) String() string {
	return k.dev + "/" + k.metric + "@" + k.start.Format(time.RFC3339)
}

// checkWindows compares summaries with the expectation computed by
// expected from what was sent.
func checkWindows(t *testing.T, got map[winKey]aggregate.Summary, sent []sent) {
	t.Helper()
	want := expected(sent, time.Minute)
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("missing window %v (have %v)", k, keys(got))
			continue
		}
		if !sameStats(g, w) {
			t.Errorf("%v:\n got %+v\nwant %+v", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected window %v", k)
		}
	}
}

// timeOf is a summary's time fields: source/replaced/rebased/unverified.
func timeOf(s aggregate.Summary) string {
	return fmt.Sprintf("%s/%d/%d/%d", s.TimeSource, s.TimeReplaced, s.TimeRebased, s.TimeUnverified)
}

// checkTimes compares the time fields of each window with want (by
// device/metric@start, as winKey prints), and requires the others to be
// other (e.g. device/0/0/0).
func checkTimes(t *testing.T, got map[winKey]aggregate.Summary, want map[string]string, other string) {
	t.Helper()
	for k, s := range got {
		w, ok := want[k.String()]
		if !ok {
			w = other
		}
		if g := timeOf(s); g != w {
			t.Errorf("%v: time fields %s, want %s", k, g, w)
		}
	}
}

func keys(m map[winKey]aggregate.Summary) []winKey {
	var ks []winKey
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestBackwardStepDoesNotFreezeWindows: after the wall clock steps 2 h
// back, a silent device's window still closes after idle_close, and a bare
// reading is stamped with the clock as it now reads, not with the latest
// time the gateway had seen. (Before, the gateway's clock was the largest
// time journaled: it stood still for 2 h, bare readings went into the
// window 2 h ahead and idle_close never fired.)
func TestBackwardStepDoesNotFreezeWindows(t *testing.T) {
	clk := &wallClock{t: t0}
	r := newRestartable(t, clk.now, nil, nil)
	r.publish("dev-a", "sensors/dev-a/t", "1")
	back := t0.Add(-2 * time.Hour).Add(10 * time.Second)
	clk.set(back)
	r.publish("dev-b", "sensors/dev-b/t", "2")
	clk.set(back.Add(91 * time.Second))
	// Both windows close by idle_close while the gateway runs.
	got := r.summaries(2, time.Minute)
	checkWindows(t, got, []sent{{"dev-a", "t", "", t0, 1}, {"dev-b", "t", "", back, 2}})
	checkTimes(t, got, nil, "gateway/0/0/0") // bare readings: stamped on arrival
}

// TestForwardGlitchDoesNotOutliveRestart: the wall clock jumps 5 h ahead
// and back; after a restart, a bare reading is stamped with the clock as it
// reads. (Before, the checkpoint kept the glitch's time as the gateway's
// clock, and every bare reading after the restart was stamped 5 h ahead.)
func TestForwardGlitchDoesNotOutliveRestart(t *testing.T) {
	clk := &wallClock{t: t0}
	r := newRestartable(t, clk.now, nil, nil)
	r.publish("dev-a", "sensors/dev-a/t", "1")
	clk.set(t0.Add(5 * time.Hour))
	r.publish("dev-b", "sensors/dev-b/t", "2")
	clk.set(t0.Add(10 * time.Second))
	r.restart()
	r.publish("dev-c", "sensors/dev-c/t", "3")
	r.stop() // closes the open windows
	got := r.summaries(3, time.Minute)
	// dev-b's reading is stamped with the clock of its arrival: the gateway
	// cannot tell a glitch of a synchronized clock from the truth.
	checkWindows(t, got, []sent{{"dev-a", "t", "", t0, 1}, {"dev-b", "t", "", t0.Add(5 * time.Hour), 2}, {"dev-c", "t", "", t0.Add(10 * time.Second), 3}})
}

// TestUnsetDeviceClockStampedOnArrival: a device that never set its clock
// publishes 1970 times; with the gateway's clock synchronized (the
// default for an injected clock) its readings are stamped on arrival, and
// no summary is ever made for a window in 1970. (Before, the device's
// first reading set its watermark in 1970 and a 1970 summary was sent.)
func TestUnsetDeviceClockStampedOnArrival(t *testing.T) {
	clk := &wallClock{t: t0}
	r := newRestartable(t, clk.now, nil, nil)
	r.publish("esp-1", "sensors/esp-1/t", `{"v":3,"t":"1970-01-01T00:00:10Z"}`)
	clk.set(t0.Add(5 * time.Second))
	r.publish("esp-1", "sensors/esp-1/t", `{"v":4,"t":"1970-01-01T00:00:15Z"}`)
	r.publish("esp-1", "sensors/esp-1", `{"t":20000,"rh":40}`) // Unix ms 20000: 1970 too
	r.stop()
	got := r.summaries(2, time.Minute)
	checkWindows(t, got, []sent{{"esp-1", "t", "", t0, 3}, {"esp-1", "t", "", t0.Add(5 * time.Second), 4}, {"esp-1", "rh", "", t0.Add(5 * time.Second), 40}})
	// The summaries say the times are the gateway's, replaced.
	checkTimes(t, got, map[string]string{"esp-1/t@2026-11-30T10:05:00Z": "gateway/2/0/0", "esp-1/rh@2026-11-30T10:05:00Z": "gateway/1/0/0"}, "")
}

// TestReadingAfterRestartRevisesFlushedWindow: the shutdown closes every
// open window; a reading for one of them after the restart revises it
// (revision 1, covering both readings) rather than starting it again at
// revision 0, which would give the window two different revisions 0.
func TestReadingAfterRestartRevisesFlushedWindow(t *testing.T) {
	clk := &wallClock{t: t0}
	r := newRestartable(t, clk.now, nil, nil)
	r.publish("dev-a", "sensors/dev-a/t", "1")
	r.restart()
	clk.set(t0.Add(5 * time.Second))
	r.publish("dev-a", "sensors/dev-a/t", "2")
	r.stop()
	got := r.summaries(2, time.Minute)
	checkWindows(t, got, []sent{{"dev-a", "t", "", t0, 1}, {"dev-a", "t", "", t0.Add(5 * time.Second), 2}})
	if a := got[winKey{"dev-a", "t", t0.Truncate(time.Minute)}]; a.Revision != 1 || a.Late != 1 {
		t.Errorf("revision %d late %d, want 1 and 1", a.Revision, a.Late)
	}
}
