//go:build e2e

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// TestSeriesBombBinary: one device publishes a million metric names, 4,000
// new ones per publication, to the built binary. The gateway keeps
// aggregate.max_metrics_per_device series of it, puts each publication's
// refused readings in one dead letter, and its peak memory stays far below
// what a million series cost (317 MiB before the limits). Killed and
// started again, the replay of the same journal needs no more memory and
// rebuilds the same series: no crash loop.
func TestSeriesBombBinary(t *testing.T) {
	need(t, "mosquitto_pub")
	const pubs, perPub = 250, 4000
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	_, brokers := kafkatest.Start(t, 1, "edge.summaries", "edge.deadletter", "edge.offsets")
	httpAddr := kafkatest.Addr(kafkatest.FreePort(t))
	logs := t.TempDir()
	g := &crashGateway{t: t, bin: bin, cfg: filepath.Join(dir, "edgegate.yaml"), mqtt: kafkatest.Addr(kafkatest.FreePort(t)), logs: logs}
	os.WriteFile(g.cfg, []byte(fmt.Sprintf(`gateway: {id: bomb-gw, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true, publish_rate_per_client: 0}
kafka: {brokers: ["%s"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
http: {listen: "%s"}
storage: {checkpoint_interval: 1h}
log: {level: info}
`, filepath.Join(dir, "data"), g.mqtt, brokers[0], httpAddr)), 0o600)
	g.start()
	defer func() {
		if g.cmd.ProcessState == nil {
			g.kill()
		}
		if t.Failed() {
			for i := 1; i <= g.started; i++ {
				b, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("run-%03d.log", i)))
				lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
				t.Logf("run %d log (last lines):\n%s", i, strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	}()

	host, port, _ := net.SplitHostPort(g.mqtt)
	for p := range pubs {
		var b strings.Builder
		b.WriteByte('{')
		for i := range perPub {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"m%d_%d":1`, p, i)
		}
		b.WriteByte('}')
		cmd := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-q", "1", "-i", "bomb", "-t", "sensors/bomb", "-s")
		cmd.Stdin = strings.NewReader(b.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("publication %d: mosquitto_pub: %v\n%s", p, err, out)
		}
	}
	type status struct {
		MQTT struct {
			Publishes uint64
			Series    int
			Outcomes  map[string]uint64
		}
	}
	get := func(wantPubs uint64) status {
		deadline := time.Now().Add(60 * time.Second)
		for {
			var st status
			if resp, err := http.Get("http://" + httpAddr + "/api/status"); err == nil {
				json.NewDecoder(resp.Body).Decode(&st)
				resp.Body.Close()
				if st.MQTT.Publishes >= wantPubs {
					return st
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the gateway decoded %d publications, want %d", st.MQTT.Publishes, wantPubs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	st := get(pubs)
	hwm := peakRSS(t, g.cmd.Process.Pid)
	const kept = 256 // aggregate.max_metrics_per_device
	if st.MQTT.Series != kept || st.MQTT.Outcomes["aggregated"] != kept || st.MQTT.Outcomes["too_many_series"] != pubs*perPub-kept {
		t.Errorf("series %d, aggregated %d, too_many_series %d; want %d, %d, %d", st.MQTT.Series, st.MQTT.Outcomes["aggregated"],
			st.MQTT.Outcomes["too_many_series"], kept, kept, pubs*perPub-kept)
	}
	t.Logf("%d publications × %d new metrics: %d series kept; peak RSS %.1f MiB", pubs, perPub, st.MQTT.Series, float64(hwm)/1024)

	// No checkpoint was written (checkpoint_interval 1h): the restart
	// replays every publication.
	g.kill()
	g.start()
	st = get(pubs)
	hwm2 := peakRSS(t, g.cmd.Process.Pid)
	if st.MQTT.Series != kept {
		t.Errorf("after the restart: %d series, want %d", st.MQTT.Series, kept)
	}
	t.Logf("restart: replayed; %d series; peak RSS %.1f MiB", st.MQTT.Series, float64(hwm2)/1024)
	if hwm2 > hwm+hwm/10 {
		t.Errorf("the replay peaked at %.1f MiB, more than the run that wrote the journal (%.1f MiB)", float64(hwm2)/1024, float64(hwm)/1024)
	}
	for run, h := range []uint64{hwm, hwm2} {
		if h > 150<<10 {
			t.Errorf("run %d: peak RSS %.1f MiB; a million series cost 317 MiB of heap before the limits, the bound is 150 MiB", run+1, float64(h)/1024)
		}
	}
	if err := g.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	// One dead letter per publication: all of them, once (the replay's
	// outputs were already stored and are not queued again).
	dead := kafkatest.Consume(t, brokers, "edge.deadletter", pubs, 60*time.Second)
	if len(dead) != pubs {
		t.Errorf("%d dead letters in Kafka, want %d (one per publication)", len(dead), pubs)
	}
}

// peakRSS returns the process's VmHWM in KiB.
func peakRSS(t *testing.T, pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
