//go:build e2e

package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	packets3 "github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
	"github.com/edgegate/edgegate/gateway/payload"
)

var (
	nemesisTime = flag.Duration("nemesis.time", 150*time.Second, "TestNemesis: how long the faults and the hostile clients run")
	nemesisSeed = flag.Uint64("nemesis.seed", 0, "TestNemesis: the seed of the schedule and of every client (0: a random one, printed)")
	// Exhausting the gateway's descriptors kills its MQTT listener for
	// good (EMFILE on accept; being fixed on branch listen): off by
	// default, the descriptor pressure stays under the limit.
	nemesisOnly   = flag.String("nemesis.only", "", "TestNemesis: draw faults only of these kinds, comma-separated (sigkill, sigterm, cut, latency, slowclose, storm, kafka, fds)")
	nemesisKeep   = flag.Bool("nemesis.keep", false, "TestNemesis: keep the work directory (gateway logs, data, client logs) even when the run passes")
	nemesisEMFILE = flag.Bool("nemesis.emfile", false, "TestNemesis: descriptor pressure past the gateway's RLIMIT_NOFILE (kills the listener until the EMFILE fix lands)")
)

// The bounds the run is held to.
const (
	// Peak RSS: the gateway's own bounds on what it holds for clients
	// (retained 32 MiB, queued messages 64 MiB, publications waiting for
	// the card 8 MiB) come to about 100 MiB; the rest is Go's heap
	// headroom (GOGC 100 doubles the live heap), the sockets of the
	// attackers and a replay after a SIGKILL. 300 MiB is three times a
	// quiet gateway's peak with room to spare: far above it means a
	// bound does not hold.
	nemesisMaxRSSMiB = 300
	// PUBACK p99 of the probe device (straight to the gateway, beside
	// the attackers): on a quiet machine tens of ms; on a loaded shared
	// 2-core machine with fsyncs, seconds are not a stall but minutes
	// are. 2 s is far above the first and far below the write timeout.
	nemesisMaxP99 = 2 * time.Second
	// nemesisNoFile is the gateway's RLIMIT_NOFILE (soft and hard, so
	// that Go cannot raise it).
	nemesisNoFile = 2048
)

// A fault in the schedule.
type fault struct {
	At    time.Duration // from the start of the run
	Kind  string
	Dur   time.Duration // how long it lasts (down time, toxic time)
	Param int           // kind-specific: latency ms, sockets, storm clients
}

func (f fault) String() string {
	s := fmt.Sprintf("%8s  %-10s for %-7s", f.At.Truncate(time.Millisecond), f.Kind, f.Dur.Truncate(time.Millisecond))
	switch f.Kind {
	case "latency":
		s += fmt.Sprintf(" latency %d ms ± %d ms", f.Param, f.Param/5)
	case "slowclose":
		s += fmt.Sprintf(" close delayed %d ms", f.Param)
	case "fds":
		s += fmt.Sprintf(" %d idle sockets", f.Param)
	case "storm":
		s += fmt.Sprintf(" %d new clients at once", f.Param)
	}
	return s
}

var faultKinds = []string{"sigkill", "sigterm", "cut", "latency", "slowclose", "storm", "kafka", "fds"}

// schedule draws the faults of a run of length total from rng: one at a
// time, half a second to 5 s apart.
func schedule(rng *rand.Rand, total time.Duration, kinds []string) []fault {
	var out []fault
	at := time.Duration(2+rng.IntN(3)) * time.Second
	for at < total-5*time.Second {
		f := fault{At: at, Kind: kinds[rng.IntN(len(kinds))]}
		ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
		switch f.Kind {
		case "sigkill":
			f.Dur = ms(0, 1500)
		case "sigterm":
			f.Dur = ms(0, 1000)
		case "cut":
			f.Dur = ms(50, 2000)
		case "latency":
			// Under the gateway's 1 s receipt margin, jitter included.
			f.Dur, f.Param = ms(2000, 8000), 50+rng.IntN(750)
		case "slowclose":
			f.Dur, f.Param = ms(2000, 8000), 100+rng.IntN(800)
		case "storm":
			f.Dur, f.Param = ms(500, 2000), 50+rng.IntN(250)
		case "kafka":
			f.Dur = ms(2000, 15000)
		case "fds":
			f.Dur, f.Param = ms(2000, 8000), 200+rng.IntN(400)
		}
		f.Dur = min(f.Dur, total-f.At) // the last ends with the run
		out = append(out, f)
		at += f.Dur + ms(500, 5000)
	}
	return out
}

// nemesis is one run: the gateway, what stands between it and its
// clients, and what the clients recorded.
type nemesis struct {
	t       *testing.T
	seed    uint64
	g       *crashGateway
	gwAddr  string // the gateway's MQTT listener
	devAddr string // the proxy in front of it, for the devices
	http    string
	proxy   *toxiproxy.Proxy
	link    *kafkatest.Link
	brokers []string
	work    string

	mu       sync.Mutex
	pid      int // the running gateway's
	runs     int // starts of the gateway so far
	checks   sync.WaitGroup
	peakKiB  int      // VmHWM, the highest of every run
	problems []string // liveness failures seen during the run
	lat      []time.Duration
	atk      attackTally
}

type attackTally struct {
	noReadPubs, pings, pingConns, huge, hugeOver, retained, qos0, spBirths, badPasswords, fdSockets, stormClients atomic.Int64
}

func (n *nemesis) problem(format string, args ...any) {
	n.mu.Lock()
	n.problems = append(n.problems, fmt.Sprintf(format, args...))
	n.mu.Unlock()
	n.t.Logf("PROBLEM: "+format, args...)
}

// TestNemesis runs the real binary behind a toxiproxy, with well-behaved
// devices of four client stacks, hostile clients all along and a seeded
// schedule of faults (SIGKILL, SIGTERM, connection cuts, latency and slow
// closes under the 1 s receipt margin, reconnect storms, Kafka outages,
// descriptor pressure); then stops the devices, stops the gateway with
// SIGTERM and checks that every acknowledged reading counts exactly once
// in what a read_committed consumer sees, that the listeners still
// accept, and the gateway's peak RSS and the probe's PUBACK p99 against
// their bounds. Replay a run with -nemesis.seed.
func TestNemesis(t *testing.T) {
	need(t, "mosquitto_pub")
	seed := *nemesisSeed
	if seed == 0 {
		seed = rand.Uint64() >> 1
	}
	t.Logf("nemesis seed %d (replay: make nemesis NEMESIS_SEED=%d NEMESIS_TIME=%s)", seed, seed, *nemesisTime)
	rng := rand.New(rand.NewPCG(seed, 0))
	kinds := faultKinds
	if *nemesisOnly != "" {
		kinds = strings.Split(*nemesisOnly, ",")
		for _, k := range kinds {
			if !slices.Contains(faultKinds, k) {
				t.Fatalf("-nemesis.only: no fault kind %q; the kinds are %v", k, faultKinds)
			}
		}
	}
	plan := schedule(rng, *nemesisTime, kinds)
	var sb strings.Builder
	for _, f := range plan {
		sb.WriteString("\n  " + f.String())
	}
	t.Logf("schedule (%d faults over %s; hostile clients all along):%s", len(plan), *nemesisTime, sb.String())

	work, err := os.MkdirTemp("", "edgegate-nemesis-")
	if err != nil {
		t.Fatal(err)
	}
	n := &nemesis{t: t, seed: seed, work: work}
	defer func() {
		if t.Failed() || *nemesisKeep {
			t.Logf("gateway logs and data, client logs kept in %s (seed %d)", work, seed)
		} else {
			os.RemoveAll(work)
		}
	}()
	bin := build(t, work, ".", "edgegate", runtime.GOARCH, "")
	n.link, _, n.brokers = kafkatest.StartWithLink(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")

	n.gwAddr = kafkatest.Addr(kafkatest.FreePort(t))
	n.http = kafkatest.Addr(kafkatest.FreePort(t))
	zerolog.SetGlobalLevel(zerolog.Disabled) // toxiproxy logs through zerolog's global logger
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	n.proxy = toxiproxy.NewProxy(server, "mqtt", "127.0.0.1:0", n.gwAddr)
	if err := n.proxy.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.proxy.Stop()
	n.devAddr = n.proxy.Listen

	logs := filepath.Join(work, "logs")
	os.Mkdir(logs, 0o755)
	// A users file, for the attacker with bad passwords; devices are
	// anonymous.
	users := filepath.Join(work, "users")
	pw := exec.Command(bin, "passwd", "-c", users, "n-user-1")
	pw.Stdin = strings.NewReader("right-password\n")
	if out, err := pw.CombinedOutput(); err != nil {
		t.Fatalf("edgegate passwd: %v\n%s", err, out)
	}
	n.g = &crashGateway{t: t, bin: bin, cfg: filepath.Join(work, "edgegate.yaml"), mqtt: n.gwAddr, logs: logs, nofile: nemesisNoFile}
	// The devices come through the proxy from 127.0.0.1, exempt from the
	// connection rate as a site's devices behind one address would be
	// let in by configuration; the attackers come from 127.0.0.2-9 and
	// are held to it.
	os.WriteFile(n.g.cfg, []byte(fmt.Sprintf(`gateway: {id: nemesis-gw, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true, users_file: %s, connect_rate_exempt: ["127.0.0.1/32"]}
kafka: {brokers: ["%s"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
storage: {checkpoint_interval: 1s}
http: {listen: "%s"}
sparkplug: {enabled: true}
log: {level: info}
`, filepath.Join(work, "data"), n.gwAddr, users, n.brokers[0], n.http)), 0o600)
	n.startGateway()
	defer func() {
		if n.g.cmd != nil && n.g.cmd.ProcessState == nil {
			n.g.kill()
		}
	}()
	stopRSS := n.sampleRSS()

	// Well-behaved devices.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	paho3 := []*paho3Device{startPaho3(t, n.devAddr, "n-paho3-1", rand.New(rand.NewPCG(seed, 1))), startPaho3(t, n.devAddr, "n-paho3-2", rand.New(rand.NewPCG(seed, 2)))}
	mosq := startMosquitto(t, n.devAddr, "n-mosq-1", work)
	py := startPython(t, n.devAddr, "n-py-1", work)
	fleet := &firmwaresim.Fleet{Addr: n.devAddr, Truth: &firmwaresim.Truth{}, Seed: seed}
	for i := range 4 {
		fleet.Devices = append(fleet.Devices, firmwaresim.Device{ID: fmt.Sprintf("n-fw-%d", i+1),
			Metrics:  []firmwaresim.Metric{{Name: "v", Signal: firmwaresim.Signal{Base: 20, Noise: 1, Resolution: 0.5}}},
			Interval: time.Duration(10+10*i) * time.Millisecond, QoS: 1, Form: firmwaresim.FormBare})
	}
	fctx, fcancel := context.WithCancel(ctx)
	fleetDone := make(chan struct{})
	go func() { fleet.Run(fctx); close(fleetDone) }()
	probe := n.startProbe(ctx)
	storm := &stormDevices{}

	// Hostile clients, all along.
	actx, acancel := context.WithCancel(ctx)
	var attackers sync.WaitGroup
	for i, a := range []func(context.Context, *rand.Rand){n.nonReader, n.pingFlood, n.hugePayloads, n.retainedFlood, n.qos0Flood, n.sparkplugGames, n.badPasswords} {
		attackers.Add(1)
		go func() { defer attackers.Done(); a(actx, rand.New(rand.NewPCG(seed, uint64(100+i)))) }()
	}

	// The faults.
	start := time.Now()
	for _, f := range plan {
		time.Sleep(time.Until(start.Add(f.At)))
		if late := time.Since(start) - f.At; late > time.Second {
			t.Logf("%s: %s begins %s late", f.At, f.Kind, late.Truncate(time.Millisecond))
		}
		n.apply(f, fleet, storm)
	}
	time.Sleep(time.Until(start.Add(*nemesisTime)))
	t.Logf("faults over after %s; stopping the attackers and devices", time.Since(start).Truncate(time.Second))

	acancel()
	attackers.Wait()
	probe.stop()
	fcancel()
	<-fleetDone
	for _, d := range paho3 {
		d.finish(t)
	}
	mosq.finish(t)
	py.finish(t)

	// Every listener still accepts: a fresh client straight to the
	// gateway and one through the proxy get their PUBACK; the HTTP
	// endpoint answers.
	fresh := map[string]int{}
	for _, c := range []struct{ id, addr string }{{"n-fresh-direct", n.gwAddr}, {"n-fresh-proxy", n.devAddr}} {
		if err := publishOnce(c.addr, c.id); err != nil {
			n.problem("listener %s: a fresh client got no PUBACK: %v", c.addr, err)
		} else {
			fresh[c.id] = 1
		}
	}
	if resp, err := http.Get("http://" + n.http + "/metrics"); err != nil || resp.StatusCode != 200 {
		n.problem("HTTP listener %s: %v", n.http, err)
	} else {
		resp.Body.Close()
	}

	// SIGTERM closes every open window; a stop that had to be killed
	// closed none, so start and stop again (twice at most).
	for i := 0; !n.stopGateway("final stop") && i < 2; i++ {
		n.startGateway()
	}
	n.startGateway() // delivers whatever the shutdown's grace period left queued

	// Expected, per device.
	rows := []*nemesisRow{}
	for _, d := range paho3 {
		rows = append(rows, d.row())
	}
	rows = append(rows, mosq.row(), py.row())
	rows = append(rows, fleetRows(fleet.Truth.Sent())...)
	rows = append(rows, probe.row(), storm.row())
	for _, id := range []string{"n-fresh-direct", "n-fresh-proxy"} {
		rows = append(rows, &nemesisRow{name: id, client: "paho.golang v5 clean", devices: []string{id}, sent: 1, acked: fresh[id], exact: true})
	}
	n.readBack(rows)
	n.stopGateway("last stop")
	stopRSS()
	n.checks.Wait()

	// The table, then the verdicts.
	var tb strings.Builder
	fmt.Fprintf(&tb, "\n%-16s %-28s %8s %8s %8s %6s %5s  %s", "device", "client", "sent", "acked", "counted", "dups", "ok", "note")
	for _, r := range rows {
		ok := r.ok()
		fmt.Fprintf(&tb, "\n%-16s %-28s %8d %8d %8d %6d %5v  %s", r.name, r.client, r.sent, r.acked, r.counted, r.dups, ok, r.note)
		if !ok {
			t.Errorf("%s (%s): %d sent, %d acknowledged, %d counted in Kafka: %s", r.name, r.client, r.sent, r.acked, r.counted, r.verdict())
		}
	}
	t.Logf("seed %d; per device (counted: sum of count over each window's highest revision, read_committed; dups: summary ids read twice):%s", seed, tb.String())
	p50, p99, pmax := quantiles(n.lat)
	t.Logf("probe PUBACK (straight to the gateway, %d publications): p50 %s p99 %s max %s (bound on p99: %s)", len(n.lat), p50, p99, pmax, nemesisMaxP99)
	t.Logf("gateway peak RSS (VmHWM, highest of %d runs): %d MiB (bound %d MiB)", n.g.started, n.peakKiB/1024, nemesisMaxRSSMiB)
	a := &n.atk
	t.Logf("attackers: non-reader %d publications, PINGREQ flood %d pings on %d connections, %d payloads near max_packet_bytes and %d over, %d retained, %d QoS 0, %d Sparkplug births in many groups, %d CONNECTs with a bad password, %d idle sockets, %d storm clients",
		a.noReadPubs.Load(), a.pings.Load(), a.pingConns.Load(), a.huge.Load(), a.hugeOver.Load(), a.retained.Load(), a.qos0.Load(), a.spBirths.Load(), a.badPasswords.Load(), a.fdSockets.Load(), a.stormClients.Load())
	if p99 > nemesisMaxP99 {
		t.Errorf("probe PUBACK p99 %s over its bound %s", p99, nemesisMaxP99)
	}
	if n.peakKiB > nemesisMaxRSSMiB<<10 {
		t.Errorf("gateway peak RSS %d MiB over its bound %d MiB", n.peakKiB>>10, nemesisMaxRSSMiB)
	}
	for _, p := range n.problems {
		t.Errorf("liveness: %s", p)
	}
	if t.Failed() {
		t.Logf("replay: make nemesis NEMESIS_SEED=%d NEMESIS_TIME=%s", seed, *nemesisTime)
	}
}

// startGateway starts the gateway and notes its pid for the RSS sampler.
func (n *nemesis) startGateway() {
	n.g.launch()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", n.gwAddr); err == nil {
			c.Close()
			break
		}
		if n.g.cmd.ProcessState != nil || time.Now().After(deadline) {
			n.t.Fatalf("start %d: gateway never listened (seed %d); see %s", n.g.started, n.seed, n.g.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.mu.Lock()
	n.pid, n.runs = n.g.cmd.Process.Pid, n.g.started
	n.mu.Unlock()
}

// sampleRSS reads the gateway's VmHWM four times a second.
func (n *nemesis) sampleRSS() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			n.mu.Lock()
			pid := n.pid
			n.mu.Unlock()
			if kib := vmHWM(pid); kib > 0 {
				n.mu.Lock()
				n.peakKiB = max(n.peakKiB, kib)
				n.mu.Unlock()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func vmHWM(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			k, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return k
		}
	}
	return 0
}

// stopGateway stops the gateway with SIGTERM, which must end it within
// 30 s; if not, SIGQUIT writes its goroutines into the run's log and
// SIGKILL ends it. It reports whether SIGTERM did.
func (n *nemesis) stopGateway(when string) bool {
	n.g.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- n.g.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			n.problem("%s: SIGTERM: gateway exited with %v (run %d)", when, err, n.g.started)
		}
		return err == nil
	case <-time.After(30 * time.Second):
		n.problem("%s: SIGTERM: gateway still running after 30 s (run %d): killed; its goroutines are in %s", when, n.g.started,
			filepath.Join(n.g.logs, fmt.Sprintf("run-%03d.log", n.g.started)))
		n.g.cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(time.Second)
		n.g.cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	return false
}

// apply runs one fault to its end.
func (n *nemesis) apply(f fault, fleet *firmwaresim.Fleet, storm *stormDevices) {
	t := n.t
	switch f.Kind {
	case "sigkill":
		n.g.kill()
		time.Sleep(f.Dur)
		n.startGateway()
	case "sigterm":
		n.stopGateway(f.At.String())
		time.Sleep(f.Dur)
		n.startGateway()
	case "cut":
		n.proxy.Stop()
		time.Sleep(f.Dur)
		if err := n.proxy.Start(); err != nil {
			t.Fatalf("restart the proxy: %v", err)
		}
	case "latency":
		n.toxic(f, fmt.Sprintf(`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, f.Param, f.Param/5))
	case "slowclose":
		n.toxic(f, fmt.Sprintf(`{"name":"slowclose","type":"slow_close","stream":"downstream","attributes":{"delay":%d}}`, f.Param))
	case "storm":
		// Every device's connection dropped at once, and new clients
		// connecting at once beside them as they come back.
		n.proxy.Stop()
		fleet.Storm()
		time.Sleep(100 * time.Millisecond)
		if err := n.proxy.Start(); err != nil {
			t.Fatalf("restart the proxy: %v", err)
		}
		storm.run(n, f.Param)
		time.Sleep(f.Dur)
	case "kafka":
		n.link.Cut()
		time.Sleep(f.Dur)
		n.link.Restore()
		n.checks.Add(1)
		go func() { defer n.checks.Done(); n.deliveryResumes(f) }()
	case "fds":
		k := f.Param
		if *nemesisEMFILE {
			k = nemesisNoFile + 200
		}
		var conns []net.Conn
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 8)}}
		for range k {
			c, err := d.Dial("tcp", n.gwAddr)
			if err != nil {
				break
			}
			conns = append(conns, c)
		}
		n.atk.fdSockets.Add(int64(len(conns)))
		time.Sleep(f.Dur)
		for _, c := range conns {
			c.Close()
		}
	}
}

// deliveryResumes checks that, once Kafka is back, the gateway delivers
// again within 40 s (kafka.stall_timeout is 10 s, then a reconnect):
// its delivered count grows, or nothing is left queued. A restart of the
// gateway meanwhile ends the check.
func (n *nemesis) deliveryResumes(f fault) {
	run := n.started()
	before, _, err := n.queueFigures()
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if n.started() != run {
			return
		}
		delivered, queued, err2 := n.queueFigures()
		if err2 == nil && (err != nil || delivered > before || queued == 0) {
			return
		}
	}
	if n.started() == run {
		n.problem("%s: Kafka back for 40 s, and the gateway delivered nothing (run %d; edgegate_queue_delivered_total %g)", f.At+f.Dur, run, before)
	}
}

func (n *nemesis) started() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runs
}

// queueFigures reads edgegate_queue_delivered_total and
// edgegate_queue_records from the gateway's /metrics.
func (n *nemesis) queueFigures() (delivered, queued float64, err error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + n.http + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "edgegate_queue_delivered_total "); ok {
			delivered, _ = strconv.ParseFloat(v, 64)
		} else if v, ok := strings.CutPrefix(sc.Text(), "edgegate_queue_records "); ok {
			queued, _ = strconv.ParseFloat(v, 64)
		}
	}
	return delivered, queued, sc.Err()
}

func (n *nemesis) toxic(f fault, spec string) {
	name := map[string]string{"latency": "lat", "slowclose": "slowclose"}[f.Kind]
	if _, err := n.proxy.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		n.t.Fatalf("toxic %s: %v", spec, err)
	}
	time.Sleep(f.Dur)
	if err := n.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		n.t.Fatalf("remove toxic %s: %v", name, err)
	}
}

// nemesisRow is one line of the final table: a device (or a group of
// devices of one kind) and what its client recorded.
type nemesisRow struct {
	name, client string
	devices      []string // device names in Kafka
	sent, acked  int
	// exact: every publication was acknowledged once or resent in a
	// persistent session until it was, so counted must equal acked.
	// Otherwise (clean sessions) an unacknowledged attempt may have been
	// journaled: acked <= counted <= sent.
	exact   bool
	counted int64
	dups    int
	note    string
	// wantSum, when hasSum, is the sum of the acknowledged readings'
	// values (distinct per reading): with every reading acknowledged, a
	// count that matches with another sum is a loss and a double count
	// that cancel out.
	hasSum       bool
	wantSum, sum float64
}

func (r *nemesisRow) ok() bool {
	if r.dups > 0 || r.sumDiffers() {
		return false
	}
	if r.exact {
		return r.counted == int64(r.acked)
	}
	return r.counted >= int64(r.acked) && r.counted <= int64(r.sent)
}

// sumDiffers: every reading acknowledged and counted, but not the ones
// sent.
func (r *nemesisRow) sumDiffers() bool {
	return r.hasSum && r.acked == r.sent && r.counted == int64(r.acked) && r.sum != r.wantSum
}

func (r *nemesisRow) verdict() string {
	switch {
	case r.sumDiffers():
		return fmt.Sprintf("the count is right but the values sum to %g, not %g: readings lost and others counted twice", r.sum, r.wantSum)
	case r.dups > 0:
		return fmt.Sprintf("%d summaries delivered twice", r.dups)
	case r.counted < int64(r.acked):
		return fmt.Sprintf("%d acknowledged readings LOST", int64(r.acked)-r.counted)
	case r.exact && r.counted > int64(r.acked):
		return fmt.Sprintf("%d readings counted TWICE", r.counted-int64(r.acked))
	case r.counted > int64(r.sent):
		return fmt.Sprintf("%d more counted than were ever sent: counted TWICE", r.counted-int64(r.sent))
	}
	return "ok"
}

// readBack reads the summaries back (read_committed) until every row has
// at least its acknowledged readings, or a minute (three reads of a long
// run) has passed, and fills in what each row's devices count.
func (n *nemesis) readBack(rows []*nemesisRow) {
	type key struct {
		dev, metric string
		start       time.Time
	}
	// Each read is bounded in time, not by count: a long run writes
	// millions of revisions (55 minutes: over 3 million), which take far
	// more than 4 s to read back; one cut short counts only the windows
	// it reached.
	attempt := 4*time.Second + *nemesisTime/30
	deadline := time.Now().Add(max(60*time.Second, 3*attempt))
	for {
		msgs, _ := kafkatest.ConsumeN(n.brokers, "edge.summaries", 1<<30, attempt)
		latest := map[key]aggregate.Summary{}
		ids := map[string]int{}
		for _, m := range msgs {
			var s aggregate.Summary
			if err := json.Unmarshal(m.Value, &s); err != nil {
				n.t.Fatalf("summary %s: %v", m.Value, err)
			}
			ids[s.ID]++
			k := key{s.Device, s.Metric, s.WindowStart.UTC()}
			if cur, ok := latest[k]; !ok || s.Revision > cur.Revision {
				latest[k] = s
			}
		}
		counted, dups, sums := map[string]int64{}, map[string]int{}, map[string]float64{}
		for _, s := range latest {
			counted[s.Device] += s.Count
			sums[s.Device] += s.Sum
		}
		for _, m := range msgs {
			var s aggregate.Summary
			json.Unmarshal(m.Value, &s)
			if ids[s.ID] > 1 {
				dups[s.Device]++
				ids[s.ID] = 1 // once per id
			}
		}
		done := true
		for _, r := range rows {
			r.counted, r.dups, r.sum = 0, 0, 0
			for _, d := range r.devices {
				r.counted += counted[d]
				r.dups += dups[d]
				r.sum += sums[d]
			}
			if r.counted < int64(r.acked) {
				done = false
			}
		}
		if done || time.Now().After(deadline) {
			n.t.Logf("%d summary records read back (read_committed)", len(msgs))
			return
		}
	}
}

func quantiles(d []time.Duration) (p50, p99, pmax time.Duration) {
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1]
}

// publishOnce connects a fresh MQTT 5 client with a clean session and
// publishes one QoS 1 reading, which must be acknowledged.
func publishOnce(addr, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := firmwaresim.Dial(ctx, addr, id, "", "")
	if err != nil {
		return err
	}
	defer c.Disconnect(&paho.Disconnect{})
	_, err = c.Publish(ctx, &paho.Publish{Topic: "sensors/" + id + "/v", QoS: 1, Payload: []byte("1")})
	return err
}

// Well-behaved devices.

// probe publishes a QoS 1 reading every 20 ms straight to the gateway
// (clean session, eclipse/paho.golang), timing each PUBACK.
type probe struct {
	sent, acked atomic.Int64
	stop        func()
}

func (n *nemesis) startProbe(ctx context.Context) *probe {
	p := &probe{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var c *paho.Client
		for ctx.Err() == nil {
			if c == nil {
				dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
				c, _ = firmwaresim.Dial(dctx, n.gwAddr, "n-probe", "", "")
				dcancel()
				if c == nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			p.sent.Add(1)
			pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
			t0 := time.Now()
			_, err := c.Publish(pctx, &paho.Publish{Topic: "sensors/n-probe/v", QoS: 1, Payload: []byte("1")})
			pcancel()
			if err != nil {
				c.Disconnect(&paho.Disconnect{})
				c = nil
				continue
			}
			p.acked.Add(1)
			n.mu.Lock()
			n.lat = append(n.lat, time.Since(t0))
			n.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
		if c != nil {
			c.Disconnect(&paho.Disconnect{})
		}
	}()
	p.stop = func() { cancel(); <-done }
	return p
}

func (p *probe) row() *nemesisRow {
	return &nemesisRow{name: "n-probe", client: "paho.golang v5 clean, direct", devices: []string{"n-probe"},
		sent: int(p.sent.Load()), acked: int(p.acked.Load())}
}

// stormDevices are the clients of reconnect storms: each connects (clean
// session, through the proxy), publishes one QoS 1 reading and leaves.
type stormDevices struct {
	sent, acked, next atomic.Int64
	mu                sync.Mutex
	ids               []string
}

func (s *stormDevices) run(n *nemesis, k int) {
	var wg sync.WaitGroup
	for range k {
		id := fmt.Sprintf("n-storm-%d", s.next.Add(1))
		s.mu.Lock()
		if !slices.Contains(s.ids, id) {
			s.ids = append(s.ids, id)
		}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.atk.stormClients.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := firmwaresim.Dial(ctx, n.devAddr, id, "", "")
			if err != nil {
				return
			}
			defer c.Disconnect(&paho.Disconnect{})
			s.sent.Add(1)
			if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/" + id + "/v", QoS: 1, Payload: []byte("1")}); err == nil {
				s.acked.Add(1)
			}
		}()
	}
	wg.Wait()
}

func (s *stormDevices) row() *nemesisRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &nemesisRow{name: "n-storm-*", client: "paho.golang v5 clean, proxy", devices: slices.Clone(s.ids),
		sent: int(s.sent.Load()), acked: int(s.acked.Load()), note: fmt.Sprintf("%d devices", len(s.ids))}
}

// fleetRows: one row per firmware-sim device, from its truth log (every
// attempt; a failed one may have been journaled, and the device sends
// the reading again).
func fleetRows(truth []firmwaresim.Sent) []*nemesisRow {
	by := map[string]*nemesisRow{}
	var names []string
	for _, s := range truth {
		if s.Kind != firmwaresim.KindReading {
			continue
		}
		r := by[s.Device]
		if r == nil {
			r = &nemesisRow{name: s.Device, client: "firmware-sim paho.golang v5", devices: []string{s.Device}}
			by[s.Device] = r
			names = append(names, s.Device)
		}
		r.sent++
		if s.Acked {
			r.acked++
		}
	}
	slices.Sort(names)
	var out []*nemesisRow
	for _, d := range names {
		r := by[d]
		r.note = fmt.Sprintf("%d attempts failed", r.sent-r.acked)
		out = append(out, r)
	}
	return out
}

// paho3Device is eclipse/paho.mqtt.golang (3.1.1, persistent session,
// auto-reconnect) sending its readings in bursts without waiting for
// PUBACKs; its store records which were acknowledged (its tokens cannot
// tell after a reconnect).
type paho3Device struct {
	id    string
	c     mqtt3.Client
	store *nemesisStore
	next  atomic.Int64
	stop  func()
	lost  atomic.Int64
}

// nemesisStore is paho.mqtt.golang's memory store noting which
// publications were acknowledged: the client puts each in the store
// before it first sends it and deletes it when its PUBACK comes.
type nemesisStore struct {
	*mqtt3.MemoryStore
	mu     sync.Mutex
	stored map[string]string // key → payload
	acked  map[string]int    // payload → PUBACKs
	over   int               // publications overwritten in the store before their PUBACK
}

func (s *nemesisStore) Put(key string, m packets3.ControlPacket) {
	if p, ok := m.(*packets3.PublishPacket); ok {
		s.mu.Lock()
		if _, ok := s.stored[key]; ok {
			s.over++
		}
		s.stored[key] = string(p.Payload)
		s.mu.Unlock()
	}
	s.MemoryStore.Put(key, m)
}

func (s *nemesisStore) Del(key string) {
	s.mu.Lock()
	if p, ok := s.stored[key]; ok {
		s.acked[p]++
		delete(s.stored, key)
	}
	s.mu.Unlock()
	s.MemoryStore.Del(key)
}

func startPaho3(t *testing.T, addr, id string, rng *rand.Rand) *paho3Device {
	d := &paho3Device{id: id, store: &nemesisStore{MemoryStore: mqtt3.NewMemoryStore(), stored: map[string]string{}, acked: map[string]int{}}}
	opts := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(100 * time.Millisecond).SetMaxReconnectInterval(500 * time.Millisecond).
		SetKeepAlive(10 * time.Second).SetWriteTimeout(5 * time.Second).
		SetConnectionLostHandler(func(mqtt3.Client, error) { d.lost.Add(1) }).SetStore(d.store)
	d.c = mqtt3.NewClient(opts)
	if tok := d.c.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("%s: connect: %v", id, tok.Error())
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(100+rng.IntN(900)) * time.Millisecond):
			}
			if !d.c.IsConnectionOpen() {
				continue
			}
			// A backlog, pipelined: up to 300 publications at once.
			for range 1 + rng.IntN(300) {
				i := d.next.Add(1) - 1
				d.c.Publish("sensors/"+id+"/v", 1, false, strconv.FormatInt(i, 10))
			}
		}
	}()
	d.stop = func() { close(done); wg.Wait() }
	return d
}

// finish stops new readings and waits until the store has nothing
// unacknowledged.
func (d *paho3Device) finish(t *testing.T) {
	d.stop()
	deadline := time.Now().Add(90 * time.Second)
	for {
		d.store.mu.Lock()
		left := len(d.store.stored)
		d.store.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d publications still unacknowledged after 90 s", d.id, left)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.c.Disconnect(250)
}

func (d *paho3Device) row() *nemesisRow {
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	twice, sum := 0, 0.0
	for p, k := range d.store.acked {
		if k > 1 {
			twice++
		}
		v, _ := strconv.ParseFloat(p, 64)
		sum += v
	}
	return &nemesisRow{name: d.id, client: "paho.mqtt.golang 3.1.1 persist", devices: []string{d.id},
		sent: int(d.next.Load()), acked: len(d.store.acked), exact: d.store.over == 0, hasSum: true, wantSum: sum,
		note: fmt.Sprintf("%d lost conns, %d acked twice, %d overwritten", d.lost.Load(), twice, d.store.over)}
}

// lineClient is a client process fed one reading a line on its stdin
// (mosquitto_pub -l, or the Python script), whose output says which were
// acknowledged. When the process exits before its input ends it is
// started again, as a supervisor (systemd, a shell loop) would: the same
// client id and persistent session, its lines from where they were. A
// process that has taken lines but had none acknowledged for 15 s is
// killed and started again, as a device's watchdog would (mosquitto_pub
// -l gives up reconnecting once a reconnect is refused): each such kill
// is counted in the table, and the client's output is kept in the work
// directory.
type lineClient struct {
	name, id string
	args     []string // command and arguments
	sent     atomic.Int64
	mu       sync.Mutex
	stdin    io.WriteCloser // the running process's
	proc     *os.Process
	log      io.Writer // everything the processes wrote
	progress time.Time // the last acknowledgement
	watchdog int       // processes killed for making no progress
	acked    map[int64]bool
	parse    func(line string, c *lineClient)
	starts   int
	exits    []string
	values   bool // acked is keyed by the lines themselves (their values)
	ending   bool
	done     chan struct{} // closed when the last process exited
	stopFeed func()
	// mosquitto_pub's mids, per process: the sequence of the line each
	// was first sent with.
	gen       int64
	lastMid   int
	epoch     int64
	midSeq    map[int]int64
	unmatched int
}

func (c *lineClient) start(t *testing.T, work string, rate time.Duration) {
	c.done = make(chan struct{})
	f, err := os.Create(filepath.Join(work, c.id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c.log = f
	launch := func() (*exec.Cmd, io.ReadCloser, error) {
		cmd := exec.Command(c.args[0], c.args[1:]...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		cmd.Stderr = cmd.Stdout
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		c.mu.Lock()
		c.stdin, c.proc, c.starts, c.progress = in, cmd.Process, c.starts+1, time.Now()
		c.gen++
		c.lastMid, c.epoch, c.midSeq = 0, 0, map[int]int64{}
		c.mu.Unlock()
		return cmd, out, nil
	}
	cmd, out, err := launch()
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	go func() {
		defer close(c.done)
		for {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				fmt.Fprintf(c.log, "%s %s\n", time.Now().Format("15:04:05.000"), sc.Text())
				c.parse(sc.Text(), c)
			}
			err := cmd.Wait()
			c.mu.Lock()
			ending := c.ending
			if err != nil {
				c.exits = append(c.exits, err.Error())
			}
			c.mu.Unlock()
			if ending {
				return
			}
			time.Sleep(200 * time.Millisecond)
			if cmd, out, err = launch(); err != nil {
				c.mu.Lock()
				c.exits = append(c.exits, "restart: "+err.Error())
				c.mu.Unlock()
				return
			}
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(rate)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			c.mu.Lock()
			in := c.stdin
			if time.Since(c.progress) > 15*time.Second {
				c.watchdog++
				c.progress = time.Now()
				fmt.Fprintf(c.log, "%s nemesis: no acknowledgement for 15 s: killed\n", time.Now().Format("15:04:05.000"))
				c.proc.Kill()
			}
			c.mu.Unlock()
			// A line written is sent, as far as the device knows; if
			// the process dies with it unread, it is never published.
			if _, err := fmt.Fprintf(in, "%d\n", c.sent.Load()); err == nil {
				c.sent.Add(1)
			}
		}
	}()
	c.stopFeed = func() { close(stop); wg.Wait() }
}

// finish closes stdin: the client sends what it has and exits.
func (c *lineClient) finish(t *testing.T) {
	c.stopFeed()
	c.mu.Lock()
	c.ending = true
	c.stdin.Close()
	c.mu.Unlock()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Errorf("%s: still running 60 s after its input ended: killed", c.name)
		c.mu.Lock()
		c.proc.Kill()
		c.mu.Unlock()
		<-c.done
	}
}

func (c *lineClient) row() *nemesisRow {
	c.mu.Lock()
	defer c.mu.Unlock()
	note := fmt.Sprintf("%d processes, %d killed by the watchdog", c.starts, c.watchdog)
	if len(c.exits) > 0 {
		note += fmt.Sprintf(", exits: %s", strings.Join(c.exits, "; "))
	}
	if c.unmatched > 0 {
		note += fmt.Sprintf(", %d PUBACKs for mids never sent", c.unmatched)
	}
	r := &nemesisRow{name: c.id, client: c.name, devices: []string{c.id}, sent: int(c.sent.Load()), acked: len(c.acked), note: note}
	if c.values { // acked holds the lines' values
		r.hasSum = true
		for v := range c.acked {
			r.wantSum += float64(v)
		}
	}
	return r
}

var (
	nemMosqSend = regexp.MustCompile(`sending PUBLISH \(d(\d), q\d, r\d, m(\d+),`)
	nemMosqAck  = regexp.MustCompile(`received PUBACK \(Mid: (\d+), RC:0\)`)
)

// startMosquitto runs Debian's mosquitto_pub (-q 1, -c persistent, -l)
// with -d: its log says which mid each publication went out with and
// which mids were acknowledged; lines are sent in order, mids from 1.
func startMosquitto(t *testing.T, addr, id, work string) *lineClient {
	host, port, _ := net.SplitHostPort(addr)
	c := &lineClient{name: "mosquitto_pub -q1 -c -l", id: id, acked: map[int64]bool{},
		args: []string{"mosquitto_pub", "-h", host, "-p", port, "-q", "1", "-c", "-i", id, "-t", "sensors/" + id + "/v", "-l", "-d", "-k", "10"}}
	c.parse = func(line string, c *lineClient) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if m := nemMosqSend.FindStringSubmatch(line); m != nil {
			// Mids are given in line order, when a line is published
			// (connected or not); a send of a mid not seen yet, or seen
			// a wrap ago, is its line's first (after a reconnect
			// libmosquitto may send it with DUP already set); one of a
			// mid just behind the last is a resend.
			mid, _ := strconv.Atoi(m[2])
			if _, seen := c.midSeq[mid]; !seen || mid < c.lastMid-1000 {
				if mid < c.lastMid {
					c.epoch++
				}
				c.lastMid = mid
				c.midSeq[mid] = c.gen<<40 | c.epoch<<16 | int64(mid)
			}
		} else if m := nemMosqAck.FindStringSubmatch(line); m != nil {
			mid, _ := strconv.Atoi(m[1])
			if seq, ok := c.midSeq[mid]; ok {
				c.acked[seq] = true
				c.progress = time.Now()
			} else {
				c.unmatched++
			}
		}
	}
	c.start(t, work, 20*time.Millisecond)
	return c
}

// The Python client: Debian's python3-paho-mqtt under /usr/bin/python3,
// persistent session, reconnecting on its own; it prints "ack N" when
// reading N's PUBACK arrives.
const nemesisPython = `
import sys, threading, paho.mqtt.client as mqtt
host, port, cid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mids, lock = {}, threading.Lock()
def on_publish(c, u, mid):
    with lock:
        v = mids.pop(mid, None)
    if v is not None:
        print("ack", v, flush=True)
c = mqtt.Client(client_id=cid, clean_session=False, protocol=mqtt.MQTTv311)
c.on_publish = on_publish
c.max_inflight_messages_set(50)
c.reconnect_delay_set(0.1, 1)
import time
# loop_start's thread dies if its first connection fails (paho-mqtt 1.6):
# connect here until the gateway answers; it reconnects on its own after.
while True:
    try:
        c.connect(host, port, keepalive=10)
        break
    except OSError:
        time.sleep(0.2)
c.loop_start()
for line in sys.stdin:
    v = line.strip()
    with lock:
        info = c.publish("sensors/%s/v" % cid, v, qos=1)
        mids[info.mid] = v
deadline = time.time() + 50
while time.time() < deadline:
    with lock:
        if not mids: break
    time.sleep(0.05)
c.disconnect()
c.loop_stop()
`

func startPython(t *testing.T, addr, id, work string) *lineClient {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatalf("the nemesis needs Debian's python3-paho-mqtt under /usr/bin/python3: %v", err)
	}
	script := filepath.Join(work, "nemesis_client.py")
	os.WriteFile(script, []byte(nemesisPython), 0o644)
	host, port, _ := net.SplitHostPort(addr)
	c := &lineClient{name: "python3-paho-mqtt 3.1.1 persist", id: id, acked: map[int64]bool{}, values: true,
		args: []string{"/usr/bin/python3", script, host, port, id}}
	c.parse = func(line string, c *lineClient) {
		if v, ok := strings.CutPrefix(line, "ack "); ok {
			i, _ := strconv.ParseInt(v, 10, 64)
			c.mu.Lock()
			c.acked[i] = true
			c.progress = time.Now()
			c.mu.Unlock()
		}
	}
	c.start(t, work, 25*time.Millisecond)
	return c
}

// Hostile clients: raw MQTT from 127.0.0.2-7, each bounded by its pace.

func mqttStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func mqttPacket(kind byte, body []byte) []byte {
	b := []byte{kind}
	n := len(body)
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			break
		}
	}
	return append(b, body...)
}

func mqttConnect(proto byte, id string, keepAlive uint16) []byte {
	b := mqttStr(nil, "MQTT")
	b = append(b, proto, 0x02) // clean
	b = binary.BigEndian.AppendUint16(b, keepAlive)
	if proto == 5 {
		b = append(b, 0)
	}
	return mqttPacket(0x10, mqttStr(b, id))
}

// mqttPublish is a PUBLISH at qos (0 or 1), retained if retain.
func mqttPublish(proto byte, topic string, qos byte, retain bool, pid uint16, body []byte) []byte {
	b := mqttStr(nil, topic)
	if qos > 0 {
		b = binary.BigEndian.AppendUint16(b, pid)
	}
	if proto == 5 {
		b = append(b, 0)
	}
	first := byte(0x30) | qos<<1
	if retain {
		first |= 1
	}
	return mqttPacket(first, append(b, body...))
}

// attackerConn dials the gateway from ip and sends CONNECT; unless
// noRead, what the gateway writes is drained.
func (n *nemesis) attackerConn(ctx context.Context, ip byte, connect []byte, noRead bool) net.Conn {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, ip)}}
	conn, err := d.DialContext(ctx, "tcp", n.gwAddr)
	if err != nil {
		return nil
	}
	if noRead {
		conn.(*net.TCPConn).SetReadBuffer(1024)
	} else {
		go io.Copy(io.Discard, conn)
	}
	conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(connect); err != nil {
		conn.Close()
		return nil
	}
	return conn
}

func sleepOr(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// nonReader: a 3.1.1 client with a tiny receive buffer sends QoS 1
// publications and never reads their PUBACKs; held, it keeps its socket.
func (n *nemesis) nonReader(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		conn := n.attackerConn(ctx, 2, mqttConnect(4, "atk-noread", 0), true)
		if conn == nil {
			sleepOr(ctx, 500*time.Millisecond)
			continue
		}
		for pid := uint16(1); ctx.Err() == nil; pid = pid%60000 + 1 {
			conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := conn.Write(mqttPublish(4, "sensors/atk-noread/v", 1, false, pid, []byte("1"))); err == nil {
				n.atk.noReadPubs.Add(1)
			} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				break // disconnected: come back
			}
			sleepOr(ctx, time.Duration(rng.IntN(5))*time.Millisecond)
		}
		conn.Close()
		sleepOr(ctx, time.Second)
	}
}

// pingFlood: a client that reads, and sends PINGREQs a thousand times
// faster than its keep alive allows; disconnected, it comes back a
// second later.
func (n *nemesis) pingFlood(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		conn := n.attackerConn(ctx, 3, mqttConnect(4, "atk-ping", 1), false)
		if conn == nil {
			sleepOr(ctx, 500*time.Millisecond)
			continue
		}
		n.atk.pingConns.Add(1)
		for ctx.Err() == nil {
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := conn.Write([]byte{0xc0, 0, 0xc0, 0, 0xc0, 0, 0xc0, 0}); err != nil {
				break
			}
			n.atk.pings.Add(4)
			sleepOr(ctx, time.Millisecond)
		}
		conn.Close()
		sleepOr(ctx, time.Duration(500+rng.IntN(1000))*time.Millisecond)
	}
}

// hugePayloads: an MQTT 5 client sends, twice a second, a QoS 1
// publication between max_payload_bytes (64 KiB) and max_packet_bytes
// (256 KiB); one in ten goes over max_packet_bytes (the connection is
// closed, and it comes back).
func (n *nemesis) hugePayloads(ctx context.Context, rng *rand.Rand) {
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		if conn == nil {
			if conn = n.attackerConn(ctx, 4, mqttConnect(5, "atk-huge", 30), false); conn == nil {
				sleepOr(ctx, 500*time.Millisecond)
				continue
			}
		}
		size := 64<<10 + rng.IntN(192<<10-64)
		over := rng.IntN(10) == 0
		if over {
			size = 256<<10 + rng.IntN(4096)
		}
		body := make([]byte, size)
		for j := range body {
			body[j] = '7'
		}
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(mqttPublish(5, "sensors/atk-huge/v", 1, false, uint16(i%60000+1), body)); err != nil {
			conn.Close()
			conn = nil
		} else if over {
			n.atk.hugeOver.Add(1)
		} else {
			n.atk.huge.Add(1)
		}
		sleepOr(ctx, time.Duration(300+rng.IntN(400))*time.Millisecond)
	}
}

// retainedFlood: retained QoS 0 publications of 2 KiB on ever new
// topics, 100 a second.
func (n *nemesis) retainedFlood(ctx context.Context, rng *rand.Rand) {
	body := []byte(strings.Repeat("4", 2048))
	for ctx.Err() == nil {
		conn := n.attackerConn(ctx, 5, mqttConnect(4, "atk-retain", 30), false)
		if conn == nil {
			sleepOr(ctx, 500*time.Millisecond)
			continue
		}
		for ctx.Err() == nil {
			conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := conn.Write(mqttPublish(4, fmt.Sprintf("sensors/atk-retain/m%d", rng.IntN(5000)), 0, true, 0, body)); err != nil {
				break
			}
			n.atk.retained.Add(1)
			sleepOr(ctx, 10*time.Millisecond)
		}
		conn.Close()
		sleepOr(ctx, time.Second)
	}
}

// qos0Flood: QoS 0 readings in batches of 500, ten batches a second
// (five times publish_rate_per_client).
func (n *nemesis) qos0Flood(ctx context.Context, rng *rand.Rand) {
	var batch []byte
	for range 500 {
		batch = append(batch, mqttPublish(4, "sensors/atk-qos0/v", 0, false, 0, []byte("1"))...)
	}
	for ctx.Err() == nil {
		conn := n.attackerConn(ctx, 6, mqttConnect(4, "atk-qos0", 30), false)
		if conn == nil {
			sleepOr(ctx, 500*time.Millisecond)
			continue
		}
		for ctx.Err() == nil {
			conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := conn.Write(batch); err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					break
				}
			}
			n.atk.qos0.Add(500)
			sleepOr(ctx, time.Duration(80+rng.IntN(40))*time.Millisecond)
		}
		conn.Close()
		sleepOr(ctx, time.Second)
	}
}

// sparkplugGames: an edge node identity births itself in hundreds of
// groups and births hundreds of devices, and sends data by aliases it
// never defined, ten publications a second.
func (n *nemesis) sparkplugGames(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		conn := n.attackerConn(ctx, 7, mqttConnect(5, "atk-spb", 30), false)
		if conn == nil {
			sleepOr(ctx, 500*time.Millisecond)
			continue
		}
		for i := 0; ctx.Err() == nil; i++ {
			group := fmt.Sprintf("g%03d", rng.IntN(500))
			now := uint64(time.Now().UnixMilli())
			var topic string
			var body []byte
			switch rng.IntN(3) {
			case 0:
				topic = "spBv1.0/" + group + "/NBIRTH/atk-spb"
				body = payload.AppendSparkplug(nil, now, 0, []payload.SparkplugOut{
					{Name: "bdSeq", Datatype: payload.SpInt64, Kind: payload.SpLongValue, Bits: uint64(i)},
					{Name: "x", Alias: 1, HasAlias: true, Datatype: payload.SpDouble, Kind: payload.SpDoubleValue, Bits: math.Float64bits(1), Timestamp: now},
				})
				n.atk.spBirths.Add(1)
			case 1:
				topic = fmt.Sprintf("spBv1.0/%s/DBIRTH/atk-spb/d%03d", group, rng.IntN(500))
				body = payload.AppendSparkplug(nil, now, 1+i%255, []payload.SparkplugOut{
					{Name: "v", Alias: uint64(100 + rng.IntN(1000)), HasAlias: true, Datatype: payload.SpDouble, Kind: payload.SpDoubleValue, Bits: math.Float64bits(2), Timestamp: now},
				})
				n.atk.spBirths.Add(1)
			default:
				topic = "spBv1.0/" + group + "/NDATA/atk-spb"
				body = payload.AppendSparkplug(nil, now, 1+i%255, []payload.SparkplugOut{
					{Alias: uint64(rng.IntN(5000)), HasAlias: true, Kind: payload.SpDoubleValue, Bits: math.Float64bits(3), Timestamp: now},
				})
			}
			conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := conn.Write(mqttPublish(5, topic, 1, false, uint16(i%60000+1), body)); err != nil {
				break
			}
			sleepOr(ctx, 100*time.Millisecond)
		}
		conn.Close()
		sleepOr(ctx, time.Second)
	}
}

// badPasswords: CONNECTs for a user of the users file with a wrong
// password each time, as fast as the gateway answers them (each costs a
// bcrypt comparison unless the connection rate refuses it first).
func (n *nemesis) badPasswords(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		b := mqttStr(nil, "MQTT")
		b = append(b, 4, 0x02|0x80|0x40) // clean, username, password
		b = binary.BigEndian.AppendUint16(b, 30)
		b = mqttStr(b, fmt.Sprintf("n-user-1:%d", rng.IntN(1000)))
		b = mqttStr(b, "n-user-1")
		b = mqttStr(b, fmt.Sprintf("wrong-%d", rng.Uint64()))
		conn := n.attackerConn(ctx, 9, mqttPacket(0x10, b), false)
		if conn != nil {
			n.atk.badPasswords.Add(1)
			sleepOr(ctx, 50*time.Millisecond) // its CONNACK
			conn.Close()
		}
		sleepOr(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
	}
}
