//go:build e2e

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

var long = flag.Bool("long", false, "crash loop: 200 kill cycles instead of 20")

// crashGateway runs the real binary on a fixed data directory and
// listener, so that it can be killed and started again.
type crashGateway struct {
	t       *testing.T
	bin     string
	cfg     string
	mqtt    string
	logs    string
	cmd     *exec.Cmd
	started int
	// limit, when set, is the file size limit (ulimit -f, 512-byte
	// blocks) the next start runs under.
	limit int
	// nofile, when set, is the descriptor limit (ulimit -n, soft and
	// hard, so that Go does not raise it) the next start runs under.
	nofile int
}

func (g *crashGateway) start() {
	g.t.Helper()
	g.launch()
	g.waitListening()
}

// launch starts the gateway without waiting for it to listen.
func (g *crashGateway) launch() {
	g.t.Helper()
	g.started++
	logf, err := os.Create(filepath.Join(g.logs, fmt.Sprintf("run-%03d.log", g.started)))
	if err != nil {
		g.t.Fatal(err)
	}
	g.cmd = exec.Command(g.bin, "run", "--config", g.cfg)
	if g.limit > 0 {
		g.cmd = exec.Command("sh", "-c", fmt.Sprintf(`ulimit -f %d && exec "$0" run --config "$1"`, g.limit), g.bin, g.cfg)
	}
	if g.nofile > 0 {
		g.cmd = exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" run --config "$1"`, g.nofile), g.bin, g.cfg)
	}
	g.cmd.Stderr = logf
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	logf.Close()
}

// waitListening waits until the gateway accepts MQTT connections.
func (g *crashGateway) waitListening() {
	g.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", g.mqtt); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("start %d: gateway never listened; see %s", g.started, g.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (g *crashGateway) kill() {
	g.cmd.Process.Signal(syscall.SIGKILL)
	g.cmd.Wait()
}

func (g *crashGateway) log() string {
	b, _ := os.ReadFile(filepath.Join(g.logs, fmt.Sprintf("run-%03d.log", g.started)))
	return string(b)
}

func (g *crashGateway) stop() error {
	g.cmd.Process.Signal(syscall.SIGTERM)
	return g.cmd.Wait()
}

// TestCrashLoop publishes QoS 1 readings from paho devices with persistent
// sessions while the gateway is killed with SIGKILL at random moments and
// started again, 20 times (200 with -long). Only 2 closed windows are
// cached in RAM, so late readings revise windows read from the state file. Each device publishes every
// reading until it is acknowledged. At the end a read_committed consumer
// must see, for every window, a highest revision whose statistics are those
// of exactly the readings sent, and no summary twice.
func TestCrashLoop(t *testing.T) {
	cycles := 20
	if *long {
		cycles = 200
	}
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	_, brokers := kafkatest.Start(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")
	logs, err := os.MkdirTemp("", "edgegate-crash-logs-")
	if err != nil {
		t.Fatal(err)
	}
	g := &crashGateway{t: t, bin: bin, cfg: filepath.Join(dir, "edgegate.yaml"), mqtt: kafkatest.Addr(kafkatest.FreePort(t)), logs: logs}
	// publish_rate_per_client 0: the devices publish as fast as they can.
	os.WriteFile(g.cfg, []byte(fmt.Sprintf(`gateway: {id: crash-gw, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true, publish_rate_per_client: 0}
kafka: {brokers: ["%s"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
storage: {checkpoint_interval: 300ms}
aggregate: {allowed_lateness: 3h, max_retained_windows: 2}
log: {level: info}
`, filepath.Join(dir, "data"), g.mqtt, brokers[0])), 0o600)
	g.start()
	defer func() {
		if g.cmd.ProcessState == nil {
			g.kill()
		}
		if t.Failed() {
			t.Logf("gateway logs kept in %s", g.logs)
		} else {
			os.RemoveAll(g.logs)
		}
	}()

	// Devices: each keeps several publications in flight, every reading
	// stamped 10 ms after the one before (event time, from an hour ago:
	// 360,000 readings per device before any is in the future), values
	// multiples of 0.5 so that sums are exact in any order.
	const devices, inflight = 6, 4
	base := time.Now().UTC().Truncate(time.Minute).Add(-time.Hour)
	// Every 500th reading is stamped 2 minutes (and 5 ms, so no two
	// readings share a time) earlier: late, it revises a closed window.
	stamp := func(i int) time.Time {
		t := base.Add(time.Duration(i) * 10 * time.Millisecond)
		if i%500 == 499 && i > 12000 {
			t = t.Add(-2*time.Minute - 5*time.Millisecond)
		}
		return t
	}
	value := func(d, i int) float64 { return float64((d*7919+i*31)%200) / 2 }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl := startFleet(t, ctx, g.mqtt, "crash-dev", devices, inflight, func(d, i int) string {
		return fmt.Sprintf(`{"v":%g,"t":%d}`, value(d, i), stamp(i).UnixMilli())
	})

	for c := range cycles {
		time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond)
		g.kill()
		if c%5 == 4 {
			// Sometimes stay down a while: devices keep their readings.
			time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond)
		}
		g.start()
	}
	fl.finish(t)
	if err := g.stop(); err != nil { // SIGTERM closes every open window
		t.Fatalf("final stop: %v", err)
	}
	g.start() // delivers whatever the shutdown's grace period left queued

	acked := make([]int, devices)
	for d := range devices {
		acked[d] = int(fl.acked[d].Load())
	}
	records, windows := checkExactlyOnce(t, brokers, "crash-dev", acked, stamp, value)
	t.Logf("%d kill cycles, %d readings from %d devices in %d windows (%d summary records, revisions included); %d publish errors retried",
		cycles, sum(acked), devices, windows, records, fl.errs.Load())
	if err := g.stop(); err != nil {
		t.Errorf("last stop: %v", err)
	}
}

// checkExactlyOnce reads edge.summaries with a read_committed consumer
// until every window is complete (or a minute has passed) and checks that
// the highest revision of each window has the statistics of exactly the
// readings acknowledged (acked[d] for device prefix-d, readings numbered
// from 0, stamped and valued by stamp and value), and that no summary
// came twice. It returns the records read and the windows expected.
func checkExactlyOnce(t *testing.T, brokers []string, prefix string, acked []int, stamp func(i int) time.Time, value func(d, i int) float64) (records, windows int) {
	t.Helper()
	// Expected: every reading of every device exactly once.
	type key struct {
		dev   string
		start time.Time
	}
	want := map[key]aggregate.Summary{}
	firstAt, lastAt := map[key]time.Time{}, map[key]time.Time{}
	total := 0
	for d, n := range acked {
		total += n
		for i := range n {
			at := stamp(i)
			k := key{fmt.Sprintf("%s-%d", prefix, d), at.Truncate(time.Minute)}
			s, ok := want[k]
			v := value(d, i)
			if !ok {
				s = aggregate.Summary{Min: v, Max: v, First: v, Last: v}
				firstAt[k], lastAt[k] = at, at
			}
			s.Count++
			s.Sum += v
			s.Min, s.Max = min(s.Min, v), max(s.Max, v)
			if at.Before(firstAt[k]) {
				s.First, firstAt[k] = v, at
			}
			if at.After(lastAt[k]) {
				s.Last, lastAt[k] = v, at
			}
			want[k] = s
		}
	}
	t.Logf("%d readings acknowledged, in %d windows", total, len(want))

	// Read until every window's count is complete, or a timeout.
	got := map[key]aggregate.Summary{}
	ids := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		msgs, _ := kafkatest.ConsumeN(brokers, "edge.summaries", 1<<30, 3*time.Second)
		clear(got)
		clear(ids)
		for _, m := range msgs {
			var s aggregate.Summary
			if err := json.Unmarshal(m.Value, &s); err != nil {
				t.Fatalf("summary %s: %v", m.Value, err)
			}
			ids[s.ID]++
			k := key{s.Device, s.WindowStart.UTC()}
			if cur, ok := got[k]; !ok || s.Revision > cur.Revision {
				got[k] = s
			}
		}
		complete := len(got) == len(want)
		for k, w := range want {
			if got[k].Count != w.Count {
				complete = false
			}
		}
		if complete || time.Now().After(deadline) {
			records = len(msgs)
			revisions := 0
			for _, m := range msgs {
				var s aggregate.Summary
				json.Unmarshal(m.Value, &s)
				if s.Revision > 0 {
					revisions++
				}
			}
			t.Logf("%d summary records in Kafka, %d of them revisions of a window", records, revisions)
			break
		}
	}
	for id, n := range ids {
		if n > 1 {
			t.Errorf("summary %s delivered %d times", id, n)
		}
	}
	for k, w := range want {
		s, ok := got[k]
		if !ok {
			t.Errorf("%s %s: no summary", k.dev, k.start.Format(time.TimeOnly))
			continue
		}
		if s.Count != w.Count || s.Sum != w.Sum || s.Min != w.Min || s.Max != w.Max || s.First != w.First || s.Last != w.Last {
			t.Errorf("%s %s revision %d: count %d sum %g min %g max %g first %g last %g; want count %d sum %g min %g max %g first %g last %g",
				k.dev, k.start.Format(time.TimeOnly), s.Revision, s.Count, s.Sum, s.Min, s.Max, s.First, s.Last,
				w.Count, w.Sum, w.Min, w.Max, w.First, w.Last)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s %s: summary for a window nothing was sent to", k.dev, k.start)
		}
	}
	return records, len(want)
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

// fleet is paho devices with persistent sessions publishing QoS 1
// readings, each device from several goroutines, every reading until it is
// acknowledged. Device d's readings are numbered from 0; payload makes them.
type fleet struct {
	next, acked []atomic.Int64 // per device: readings begun, acknowledged
	errs        atomic.Int64   // publish attempts that failed (and were retried)
	stop        atomic.Bool
	wg          sync.WaitGroup
}

func startFleet(t *testing.T, ctx context.Context, addr, prefix string, devices, inflight int, payload func(d, i int) string) *fleet {
	t.Helper()
	return startFleetQoS(t, ctx, addr, prefix, devices, inflight, payload, func(int) byte { return 1 })
}

// startFleetQoS is startFleet with device d publishing at QoS qos(d).
func startFleetQoS(t *testing.T, ctx context.Context, addr, prefix string, devices, inflight int, payload func(d, i int) string, qos func(d int) byte) *fleet {
	t.Helper()
	u, _ := url.Parse("mqtt://" + addr)
	f := &fleet{next: make([]atomic.Int64, devices), acked: make([]atomic.Int64, devices)}
	for d := range devices {
		cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
			ServerUrls:                    []*url.URL{u},
			KeepAlive:                     30,
			CleanStartOnInitialConnection: true,
			SessionExpiryInterval:         3600,
			ReconnectBackoff:              autopaho.NewConstantBackoff(50 * time.Millisecond),
			ConnectTimeout:                2 * time.Second,
			ClientConfig:                  paho.ClientConfig{ClientID: fmt.Sprintf("%s-%d", prefix, d), PacketTimeout: 10 * time.Minute},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cm.Disconnect(context.Background()) })
		for range inflight {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				for !f.stop.Load() {
					i := int(f.next[d].Add(1) - 1)
					body := []byte(payload(d, i))
					for {
						// A publication that failed was not journaled (its
						// session did not survive, so nothing of it did):
						// publish it again until it is acknowledged.
						if err := cm.AwaitConnection(ctx); err != nil {
							return
						}
						_, err := cm.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("sensors/%s-%d/temp", prefix, d), QoS: qos(d), Payload: body})
						if err == nil {
							break
						}
						f.errs.Add(1)
						if ctx.Err() != nil {
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
					f.acked[d].Add(1)
				}
			}()
		}
	}
	return f
}

// finish stops new readings and waits until every reading begun is
// acknowledged.
func (f *fleet) finish(t *testing.T) {
	t.Helper()
	f.stop.Store(true)
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("publications still unacknowledged after 60 s")
	}
	for d := range f.next {
		if b, a := f.next[d].Load(), f.acked[d].Load(); a != b {
			t.Fatalf("device %d: %d readings begun, %d acknowledged", d, b, a)
		}
	}
}

// TestJournalWriteFailureStops runs the gateway under a file size limit,
// so that a journal write fails (EFBIG) while devices publish QoS 1
// readings. The gateway must stop at once with a clear error, never
// acknowledging what it could not write; restarted without the limit it
// recovers, devices resend what was not acknowledged, and Kafka ends up
// with every reading exactly once.
func TestJournalWriteFailureStops(t *testing.T) {
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	_, brokers := kafkatest.Start(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")
	logs := t.TempDir()
	g := &crashGateway{t: t, bin: bin, cfg: filepath.Join(dir, "edgegate.yaml"), mqtt: kafkatest.Addr(kafkatest.FreePort(t)), logs: logs,
		limit: 1024} // 512 KiB: the journal's segment reaches it after some 8,000 readings
	os.WriteFile(g.cfg, []byte(fmt.Sprintf(`gateway: {id: efbig-gw, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true}
kafka: {brokers: ["%s"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
http: {listen: ""}
`, filepath.Join(dir, "data"), g.mqtt, brokers[0])), 0o600)
	g.start()
	defer func() {
		if g.cmd.ProcessState == nil {
			g.kill()
		}
	}()
	base := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl := startFleet(t, ctx, g.mqtt, "efbig-dev", 3, 4, func(d, i int) string {
		return fmt.Sprintf(`{"v":%d,"t":%d}`, i%10, base.Add(time.Duration(i)*10*time.Millisecond).UnixMilli())
	})

	exited := make(chan error, 1)
	go func() { exited <- g.cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("gateway exit: %v, want exit code 1\n%s", err, g.log())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("gateway still running after 60 s under a 512 KiB file size limit")
	}
	last := g.log()
	if !strings.Contains(last, "edgegate: ingest journal: append: write ") || !strings.Contains(last, "file too large") {
		t.Errorf("the reason is not in the last line:\n%s", last)
	}
	acked := int64(0)
	for d := range fl.acked {
		acked += fl.acked[d].Load()
	}
	t.Logf("journal write failed after %d readings were acknowledged; the gateway said:\n%s", acked, last[strings.LastIndex(strings.TrimSpace(last), "\n")+1:])

	g.limit = 0
	g.start()
	time.Sleep(time.Second) // devices resend and go on
	fl.finish(t)
	if err := g.stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, g.log())
	}
	g.start() // delivers what the shutdown's grace period left
	defer g.stop()
	var want int64
	for d := range fl.acked {
		want += fl.acked[d].Load()
	}
	var got int64
	for deadline := time.Now().Add(30 * time.Second); got != want && time.Now().Before(deadline); {
		msgs, _ := kafkatest.ConsumeN(brokers, "edge.summaries", 1<<30, 2*time.Second)
		latest := map[string]aggregate.Summary{}
		for _, m := range msgs {
			var s aggregate.Summary
			json.Unmarshal(m.Value, &s)
			k := s.Device + s.WindowStart.String()
			if cur, ok := latest[k]; !ok || s.Revision > cur.Revision {
				latest[k] = s
			}
		}
		got = 0
		for _, s := range latest {
			got += s.Count
		}
	}
	if got != want {
		t.Errorf("Kafka counts %d readings, %d were acknowledged (each once)", got, want)
	}
}
