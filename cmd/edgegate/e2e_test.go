//go:build e2e

// End-to-end tests: the built binary, driven by clients nobody here wrote
// (Debian's mosquitto_pub and kcat), against a Kafka-protocol broker in its
// own process; and the ARM builds under qemu-user. Run with `make e2e`.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install it (apt-get install -y mosquitto-clients kcat qemu-user-static chromium systemd postgresql)", tool)
		}
	}
}

// build compiles a command for goos/goarch into dir as CI would ship it.
func build(t *testing.T, dir, pkg, name, goarch, goarm string) string {
	t.Helper()
	return buildTags(t, dir, pkg, name, goarch, goarm, "")
}

// buildTags is build with build tags: releaseTags for the ARM release
// builds.
func buildTags(t *testing.T, dir, pkg, name, goarch, goarm, tags string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-tags", tags, "-ldflags", "-s -w -X main.version=e2e", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if goarm != "" {
		cmd.Env = append(cmd.Env, "GOARM="+goarm)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s for %s: %v\n%s", pkg, goarch, err, b)
	}
	return out
}

// startKafka runs devkafka in its own process and returns its address.
func startKafka(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "--port", "0", "--partitions", "2")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("devkafka: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "kafka listening on ")
	if !ok {
		t.Fatalf("devkafka said %q", line)
	}
	return addr
}

type gatewayProc struct {
	cmd    *exec.Cmd
	mqtt   string
	http   string
	stderr *bytes.Buffer
}

// startGateway writes a config and starts `edgegate run` (under qemu when
// emulator is set), waiting until its MQTT port accepts connections.
func startGateway(t *testing.T, emulator, bin, id, kafka string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{mqtt: fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t)), http: fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t)), stderr: &bytes.Buffer{}}
	cfg := filepath.Join(t.TempDir(), "edgegate.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`gateway: {id: %s, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true, acl: {anonymous_role: admin}}
kafka: {brokers: ["%s"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
http: {listen: "%s"}
log: {level: debug}
`, id, t.TempDir(), g.mqtt, kafka, g.http)), 0o600)
	args := []string{"run", "--config", cfg}
	if emulator != "" {
		g.cmd = exec.Command(emulator, append([]string{bin}, args...)...)
	} else {
		g.cmd = exec.Command(bin, args...)
	}
	g.cmd.Stderr = g.stderr
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if g.cmd.ProcessState == nil {
			g.cmd.Process.Kill()
			g.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", id, g.stderr)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.Dial("tcp", g.mqtt)
		if err == nil {
			c.Close()
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened on %s", id, g.mqtt)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and requires a clean exit.
func (g *gatewayProc) stop(t *testing.T) {
	t.Helper()
	g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gateway exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not stop within 30 s of SIGTERM")
	}
}

// publications returns how many reading-topic publications the gateway has
// decoded, from its /api/status.
func (g *gatewayProc) publications(t *testing.T) uint64 {
	resp, err := http.Get("http://" + g.http + "/api/status")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var st struct{ MQTT struct{ Publishes uint64 } }
	json.NewDecoder(resp.Body).Decode(&st)
	return st.MQTT.Publishes
}

func (g *gatewayProc) waitPublications(t *testing.T, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for g.publications(t) < n {
		if time.Now().After(deadline) {
			t.Fatalf("gateway saw %d publications, want %d", g.publications(t), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mosquittoPub publishes each line of msgs as one message on topic, on one
// connection.
func mosquittoPub(t *testing.T, addr, topic string, qos int, msgs ...string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-q", fmt.Sprint(qos), "-t", topic, "-l", "-i", "e2e-"+strings.ReplaceAll(topic, "/", "-"))
	cmd.Stdin = strings.NewReader(strings.Join(msgs, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub %s: %v\n%s", topic, err, out)
	}
}

// kcat reads a whole topic with read_committed isolation, as key<TAB>value lines.
func kcat(t *testing.T, broker, topic string) [][2]string {
	t.Helper()
	cmd := exec.Command("kcat", "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%k\t%s\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat %s: %v", topic, err)
	}
	var recs [][2]string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, "\t"); ok {
			recs = append(recs, [2]string{k, v})
		}
	}
	return recs
}

type point struct {
	at time.Time
	v  float64
}

func summarize(pts []point) (n int64, mn, mx, sum, mean, first, last, sd float64) {
	// Points are given in event-time order, so first and last are the ends.
	mn, mx = math.Inf(1), math.Inf(-1)
	first, last = pts[0].v, pts[len(pts)-1].v
	for _, p := range pts {
		n++
		sum += p.v
		mn, mx = math.Min(mn, p.v), math.Max(mx, p.v)
	}
	mean = sum / float64(n)
	for _, p := range pts {
		sd += (p.v - mean) * (p.v - mean)
	}
	sd = math.Sqrt(sd / float64(n))
	return
}

func TestE2E(t *testing.T) {
	need(t, "mosquitto_pub", "kcat")
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	kafka := startKafka(t, build(t, dir, "../devkafka", "devkafka", runtime.GOARCH, ""))
	gw := startGateway(t, "", bin, "e2e-gw", kafka)

	// Two windows of e2e-1 (v+t, QoS 1), one of e2e-2 (object, QoS 0), one
	// of e2e-3 (SenML, QoS 1); all a few minutes in the past so none is in
	// the future and each device's own watermark governs.
	base := time.Now().UTC().Truncate(time.Minute).Add(-5 * time.Minute)
	ts := func(d time.Duration) string { return base.Add(d).Format(time.RFC3339Nano) }
	want := map[string][]point{} // device/metric/window start -> points in event-time order
	add := func(dev, metric string, d time.Duration, v float64) {
		k := dev + "/" + metric + "/" + base.Add(d).Truncate(time.Minute).Format(time.RFC3339)
		want[k] = append(want[k], point{base.Add(d), v})
	}
	var e1 []string
	for i, v := range []float64{20.5, 21, 19.75, 22.25, 23} {
		d := time.Duration(i*25) * time.Second // 0s 25s 50s 75s 100s: two windows
		e1 = append(e1, fmt.Sprintf(`{"v":%g,"t":"%s"}`, v, ts(d)))
		add("e2e-1", "temp", d, v)
	}
	e1 = append(e1, "garbage") // dead letter
	mosquittoPub(t, gw.mqtt, "sensors/e2e-1/temp", 1, e1...)
	mosquittoPub(t, gw.mqtt, "sensors/e2e-2", 0,
		fmt.Sprintf(`{"t":%d,"rh":40,"co2":410}`, base.Add(10*time.Second).UnixMilli()),
		fmt.Sprintf(`{"t":%d,"rh":42.5,"co2":415}`, base.Add(20*time.Second).UnixMilli()))
	add("e2e-2", "rh", 10*time.Second, 40)
	add("e2e-2", "co2", 10*time.Second, 410)
	add("e2e-2", "rh", 20*time.Second, 42.5)
	add("e2e-2", "co2", 20*time.Second, 415)
	mosquittoPub(t, gw.mqtt, "sensors/e2e-3", 1,
		fmt.Sprintf(`[{"bn":"e2e-3:","bt":%d,"bu":"Cel","n":"t","v":5},{"n":"t","t":30,"v":7}]`, base.Unix()))
	add("e2e-3", "t", 0, 5)
	add("e2e-3", "t", 30*time.Second, 7)
	gw.waitPublications(t, uint64(len(e1)+2+1))
	gw.stop(t) // SIGTERM closes every open window

	got := map[string]aggregate.Summary{}
	for _, rec := range kcat(t, kafka, "edge.summaries") {
		var s aggregate.Summary
		if err := json.Unmarshal([]byte(rec[1]), &s); err != nil {
			t.Fatalf("summary %q: %v", rec[1], err)
		}
		if rec[0] != "e2e-gw/"+s.Device {
			t.Errorf("key %q for %s", rec[0], s.Device)
		}
		k := s.Device + "/" + s.Metric + "/" + s.WindowStart.UTC().Format(time.RFC3339)
		if _, dup := got[k]; dup {
			t.Errorf("window %s delivered twice", k)
		}
		got[k] = s
	}
	if len(got) != len(want) {
		t.Errorf("%d windows in Kafka, want %d: %v", len(got), len(want), got)
	}
	for k, pts := range want {
		s, ok := got[k]
		if !ok {
			t.Errorf("missing window %s", k)
			continue
		}
		n, mn, mx, sum, mean, first, last, sd := summarize(pts)
		if s.Count != n || s.Min != mn || s.Max != mx || math.Abs(s.Sum-sum) > 1e-9 || math.Abs(s.Mean-mean) > 1e-9 ||
			s.First != first || s.Last != last || math.Abs(s.Stddev-sd) > 1e-9 || s.Revision != 0 || s.Gateway != "e2e-gw" {
			t.Errorf("%s: got %+v, want n=%d min=%g max=%g sum=%g mean=%g first=%g last=%g sd=%g", k, s, n, mn, mx, sum, mean, first, last, sd)
		}
	}
	if s := got["e2e-3/t/"+base.Format(time.RFC3339)]; s.Unit != "Cel" {
		t.Errorf("SenML unit %q, want Cel", s.Unit)
	}
	dl := kcat(t, kafka, "edge.deadletter")
	if len(dl) != 1 || !strings.Contains(dl[0][1], `"reason":"not_a_number"`) || !strings.Contains(dl[0][1], `"payload":"garbage"`) {
		t.Errorf("dead letters = %v", dl)
	}

	// The ARM release builds (as make cross makes them), under qemu-user,
	// accept a mosquitto_pub connection and deliver its reading to Kafka,
	// and say where to run the demo they leave out.
	for _, arch := range []struct{ name, goarch, goarm, qemu string }{
		{"armv7", "arm", "7", "qemu-arm-static"},
		{"arm64", "arm64", "", "qemu-aarch64-static"},
	} {
		t.Run(arch.name, func(t *testing.T) {
			need(t, arch.qemu)
			armBin := buildTags(t, dir, ".", "edgegate-"+arch.name, arch.goarch, arch.goarm, releaseTags)
			out, err := exec.Command(arch.qemu, armBin, "version").Output()
			if err != nil || !strings.Contains(string(out), "linux/"+arch.goarch) {
				t.Fatalf("version under %s: %v %q", arch.qemu, err, out)
			}
			out, err = exec.Command(arch.qemu, armBin, "demo").CombinedOutput()
			if code := exitCode(err); code != 2 || !strings.Contains(string(out), "demo: not in this build") || !strings.Contains(string(out), "make demo") {
				t.Errorf("demo under %s: exit %d %q", arch.qemu, code, out)
			}
			id := "e2e-" + arch.name
			g := startGateway(t, arch.qemu, armBin, id, kafka)
			mosquittoPub(t, g.mqtt, "sensors/qemu-dev/temp", 1, fmt.Sprintf(`{"v":12.5,"t":"%s"}`, ts(0)))
			g.waitPublications(t, 1)
			g.stop(t)
			found := false
			for _, rec := range kcat(t, kafka, "edge.summaries") {
				if rec[0] == id+"/qemu-dev" {
					var s aggregate.Summary
					json.Unmarshal([]byte(rec[1]), &s)
					found = s.Count == 1 && s.Last == 12.5 && s.Gateway == id
				}
			}
			if !found {
				t.Errorf("no summary from %s in Kafka", id)
			}
		})
	}
}

// exitCode is a command's exit status from its error: 0 for none, -1 if
// it did not exit.
func exitCode(err error) int {
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return -1
}
