//go:build e2e

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/bridge/summary"
)

// needNode finds node and npm: a test failure in CI (CI=true), a skip
// elsewhere.
func needNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " not found: install Node.js (apt-get install -y nodejs npm)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// tahuEdge is testdata/sparkplug/edge.js running Eclipse Tahu's
// sparkplug-client, driven one command at a time.
type tahuEdge struct {
	t        *testing.T
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan map[string]json.RawMessage
	readings []tahuReading
	dead     int
}

type tahuReading struct {
	Device, Metric string
	T              int64 // ms
	V              float64
}

// do sends a command and collects what the script reports until it is
// done; it returns the publications made so far.
func (e *tahuEdge) do(cmd string) int {
	e.t.Helper()
	if _, err := fmt.Fprintln(e.stdin, cmd); err != nil {
		e.t.Fatal(err)
	}
	for {
		select {
		case m, ok := <-e.lines:
			if !ok {
				e.t.Fatalf("edge.js ended during %s", cmd)
			}
			switch {
			case m["reading"] != nil:
				var r tahuReading
				if err := json.Unmarshal(m["reading"], &r); err != nil {
					e.t.Fatal(err)
				}
				e.readings = append(e.readings, r)
			case m["dead"] != nil:
				e.dead++
			case m["ready"] != nil:
				var n int
				json.Unmarshal(m["publications"], &n)
				return n
			}
		case <-time.After(60 * time.Second):
			e.t.Fatalf("edge.js did not finish %s", cmd)
		}
	}
}

// sparkplugStatus is what the test reads of /api/status.
type sparkplugStatus struct {
	MQTT struct {
		Publishes uint64
		Sparkplug struct {
			Nodes, NodesOnline, Devices, DevicesOnline                                                    int
			Historical, RebirthRequests, UnknownAliases, SessionsEnded, StaleDeaths, SeqGaps, BeforeBirth uint64
		}
	}
}

func spStatus(addr string) sparkplugStatus {
	var st sparkplugStatus
	resp, err := http.Get("http://" + addr + "/api/status")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	json.NewDecoder(resp.Body).Decode(&st)
	return st
}

func waitStatus(t *testing.T, addr, what string, ok func(sparkplugStatus) bool) sparkplugStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := spStatus(addr)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: status %+v", what, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSparkplugTahuInterop: an edge node with two devices on Eclipse
// Tahu's Node.js client (sparkplug-client from npm) publishes births and
// data by alias to the built binary as a device-role client, loses its
// connection (the broker sends its NDEATH will), comes back with the data
// it stored as historical DDATA (in order, then interleaved with live
// data), sends a metric by an alias it never defined and answers the
// host's rebirth request. The summaries read back with read_committed
// equal what the test computes from what the script says it sent.
func TestSparkplugTahuInterop(t *testing.T) {
	needNode(t)
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	kafka := startKafka(t, build(t, dir, "../devkafka", "devkafka", runtime.GOARCH, ""))

	// npm installs the pinned client into a directory of the test's own.
	js := filepath.Join(dir, "js")
	os.MkdirAll(js, 0o755)
	for _, f := range []string{"package.json", "package-lock.json", "edge.js"} {
		b, err := os.ReadFile(filepath.Join("testdata", "sparkplug", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(js, f), b, 0o644)
	}
	npm := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	npm.Dir = js
	if out, err := npm.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}

	mqttAddr, httpAddr := kafkatest.Addr(kafkatest.FreePort(t)), kafkatest.Addr(kafkatest.FreePort(t))
	cfg := filepath.Join(dir, "edgegate.yaml")
	// The edge node connects anonymously as the device role: its identity
	// is its client id, the edge node id. idle_close is long, so that only
	// watermarks close windows however slow the machine.
	os.WriteFile(cfg, []byte(fmt.Sprintf(`gateway: {id: gw-tahu, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true}
aggregate: {idle_close: 1h}
kafka: {brokers: ["%s"]}
http: {listen: "%s"}
sparkplug: {enabled: true, host_id: edgegate-it}
log: {level: debug}
`, filepath.Join(dir, "data"), mqttAddr, kafka, httpAddr)), 0o600)
	gw := exec.Command(bin, "run", "--config", cfg)
	var gwLog strings.Builder
	gw.Stderr = &gwLog
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			gw.Process.Kill()
			gw.Wait()
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", gwLog.String())
		}
	})
	waitStatus(t, httpAddr, "gateway start", func(s sparkplugStatus) bool {
		return s.MQTT.Sparkplug.Nodes == 0 && s.MQTT.Publishes == 0 && statusUp(httpAddr)
	})

	base := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	node := exec.Command("node", "edge.js", "mqtt://"+mqttAddr, "plant", "line1", fmt.Sprint(base.UnixMilli()))
	node.Dir = js
	node.Stderr = os.Stderr
	stdin, _ := node.StdinPipe()
	stdout, _ := node.StdoutPipe()
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	e := &tahuEdge{t: t, cmd: node, stdin: stdin, lines: make(chan map[string]json.RawMessage, 100)}
	go func() {
		defer close(e.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m map[string]json.RawMessage
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				e.lines <- m
			}
		}
	}()
	t.Cleanup(func() { stdin.Close(); node.Process.Kill(); node.Wait() })

	n := e.do("session1")
	st := waitStatus(t, httpAddr, "session 1", func(s sparkplugStatus) bool { return s.MQTT.Publishes == uint64(n) })
	if sp := st.MQTT.Sparkplug; sp.NodesOnline != 1 || sp.DevicesOnline != 2 || sp.UnknownAliases != 0 || sp.BeforeBirth != 0 || sp.SeqGaps != 0 {
		t.Fatalf("after session 1: %+v", sp)
	}
	e.do("offline")
	st = waitStatus(t, httpAddr, "the NDEATH will", func(s sparkplugStatus) bool { return s.MQTT.Sparkplug.SessionsEnded == 1 })
	if sp := st.MQTT.Sparkplug; sp.NodesOnline != 0 || sp.DevicesOnline != 0 || sp.Devices != 2 {
		t.Fatalf("after the will: %+v", sp)
	}
	n = e.do("session2")
	st = waitStatus(t, httpAddr, "session 2", func(s sparkplugStatus) bool { return s.MQTT.Publishes == uint64(n)+1 }) // + the will
	if sp := st.MQTT.Sparkplug; sp.NodesOnline != 1 || sp.DevicesOnline != 2 || sp.RebirthRequests != 1 || sp.UnknownAliases != 1 ||
		sp.Historical != 27 || sp.SeqGaps != 0 || sp.BeforeBirth != 0 || sp.StaleDeaths != 0 {
		t.Fatalf("after session 2: %+v", sp)
	}
	e.do("stop")
	waitStatus(t, httpAddr, "the NDEATH", func(s sparkplugStatus) bool { return s.MQTT.Sparkplug.SessionsEnded == 2 })
	gw.Process.Signal(os.Interrupt)
	if err := gw.Wait(); err != nil {
		t.Fatalf("gateway exit: %v", err)
	}
	stopped = true

	// The expected summaries, from the script's own record.
	type key struct {
		dev, metric string
		start       time.Time
	}
	windows := map[key][]point{}
	for _, r := range e.readings {
		at := time.UnixMilli(r.T).UTC()
		k := key{r.Device, r.Metric, at.Truncate(time.Minute)}
		windows[k] = append(windows[k], point{at, r.V})
	}
	const revisions = 3 // rpm and flow of 02:00 after the live data, flow of 01:00
	msgs := kafkatest.Consume(t, []string{kafka}, "edge.summaries", len(windows)+revisions, 30*time.Second)
	highest := map[key]summary.Summary{}
	for _, m := range msgs {
		var hs []summary.Header
		for _, h := range m.Headers {
			hs = append(hs, summary.Header{Key: h.Key, Value: h.Value})
		}
		s, err := summary.Decode(m.Value, hs)
		if err != nil {
			t.Fatalf("summary %s: %v", m.Value, err)
		}
		k := key{s.Device, s.Metric, s.WindowStart.UTC()}
		if h, ok := highest[k]; !ok || s.Revision > h.Revision {
			highest[k] = s
		}
	}
	if len(msgs) != len(windows)+revisions {
		t.Errorf("%d summaries for %d windows, want %d revisions", len(msgs), len(windows), revisions)
	}
	var revised []string
	for k, pts := range windows {
		sort.SliceStable(pts, func(i, j int) bool { return pts[i].at.Before(pts[j].at) })
		cnt, mn, mx, sum, mean, first, last, sd := summarize(pts)
		g, ok := highest[k]
		if !ok {
			t.Errorf("no summary for %v", k)
			continue
		}
		if g.Count != cnt || g.Min != mn || g.Max != mx || math.Abs(g.Sum-sum) > 1e-9*math.Max(1, math.Abs(sum)) || g.First != first || g.Last != last ||
			math.Abs(g.Mean-mean) > 1e-9*math.Max(1, math.Abs(mean)) || math.Abs(g.Stddev-sd) > 1e-6*math.Max(1, sd) {
			t.Errorf("%v: got count %d min %v max %v sum %v first %v last %v sd %v; want %d %v %v %v %v %v %v",
				k, g.Count, g.Min, g.Max, g.Sum, g.First, g.Last, g.Stddev, cnt, mn, mx, sum, first, last, sd)
		}
		if g.Revision > 0 {
			revised = append(revised, fmt.Sprintf("%s %s %s", k.dev, k.metric, k.start.Sub(base)))
		}
	}
	for k := range highest {
		if _, ok := windows[k]; !ok {
			t.Errorf("unexpected summary %v", k)
		}
	}
	sort.Strings(revised)
	if got, want := strings.Join(revised, "; "), "plant/line1/pump Motor/rpm 2m0s; plant/line1/pump flow 1m0s; plant/line1/pump flow 2m0s"; got != want {
		t.Errorf("revised windows: %s, want %s", got, want)
	}
	dl := kafkatest.Consume(t, []string{kafka}, "edge.deadletter", e.dead, 30*time.Second)
	if len(dl) != 1 || !strings.Contains(string(dl[0].Value), `"reason":"sparkplug_unknown_alias"`) || !strings.Contains(string(dl[0].Value), `"device":"plant/line1/valve"`) {
		t.Errorf("dead letters: %d, first %s", len(dl), dl[0].Value)
	}
}

// statusUp reports whether the HTTP endpoint answers.
func statusUp(addr string) bool {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}
