//go:build e2e

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// TestClocksScenarioE2E runs configs/sim/clocks.yaml (12 times faster)
// through the built gateway, in its own process, delivering to devkafka in
// another: devices whose clocks were never set (1970), are 3 days stale or
// 2 h ahead, some set right mid-run. edgesim verify must find every window
// exact, with its time_source and time_replaced; the gateway's status must
// show the 1970 readings stamped on arrival and the clocks too far ahead
// refused as future.
func TestClocksScenarioE2E(t *testing.T) {
	dir := t.TempDir()
	gwBin, kafkaBin := buildCmd(t, dir, "../edgegate", "edgegate"), buildCmd(t, dir, "../devkafka", "devkafka")
	kafka := startDevKafka(t, kafkaBin)

	sc, err := firmwaresim.LoadScenario(filepath.Join("..", "..", "configs", "sim", "clocks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules := firmwaresim.DefaultRules()
	for _, d := range []*time.Duration{&rules.Window, &rules.MaxOutOfOrder, &rules.MaxFutureSkew} {
		*d /= speed
	}
	mqttAddr, httpAddr := kafkatest.Addr(kafkatest.FreePort(t)), kafkatest.Addr(kafkatest.FreePort(t))
	cfg := filepath.Join(dir, "edgegate.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`gateway: {id: gw-clocks, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true}
aggregate: {window: %s, max_out_of_order: %s, max_future_skew: %s, idle_close: %s}
clock: {synchronized: always} # the gateway's own clock is the machine's, whatever its NTP
kafka: {brokers: ["%s"]}
http: {listen: "%s"}
`, t.TempDir(), mqttAddr, rules.Window, rules.MaxOutOfOrder, rules.MaxFutureSkew, 90*time.Second/speed, kafka, httpAddr)), 0o600)
	var stderr bytes.Buffer
	gw := exec.Command(gwBin, "run", "--config", cfg)
	gw.Stderr = &stderr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if gw.ProcessState == nil {
			gw.Process.Kill()
			gw.Wait()
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", lastLines(stderr.String(), 40))
		}
	}()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", mqttAddr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never listened on %s", mqttAddr)
		}
	}

	truthPath := filepath.Join(dir, "truth.jsonl")
	var out bytes.Buffer
	if status := runMain(context.Background(), []string{"run", "--scenario", filepath.Join("..", "..", "configs", "sim", sc.Name+".yaml"),
		"--speed", fmt.Sprint(speed), "--addr", mqttAddr, "--truth", truthPath}, &out, &out); status != 0 {
		t.Fatalf("edgesim run: status %d\n%s", status, out.String())
	}
	t.Logf("edgesim run:\n%s", lastLines(out.String(), 14))
	var st struct {
		MQTT struct {
			Outcomes   map[string]uint64
			DeviceList []struct {
				ID         string
				ClockUnset uint64
			}
			Clock struct{ Synchronized bool }
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	// SIGTERM closes every open window and gives the forwarder its grace
	// to deliver them.
	gw.Process.Signal(syscall.SIGTERM)
	if err := gw.Wait(); err != nil {
		t.Fatalf("gateway exit: %v", err)
	}

	o := st.MQTT.Outcomes
	var unset uint64
	for _, d := range st.MQTT.DeviceList {
		if strings.HasPrefix(d.ID, "esp-") {
			unset += d.ClockUnset
		}
	}
	if !st.MQTT.Clock.Synchronized || unset == 0 || o["future"] == 0 || o["device_clock_unset"] != 0 || o["gateway_clock_unset"] != 0 {
		t.Errorf("status: synchronized %v, %d readings of clocks never set, outcomes %v; want them stamped on arrival and some future",
			st.MQTT.Clock.Synchronized, unset, o)
	}
	out.Reset()
	status := runMain(context.Background(), []string{"verify", "--truth", truthPath, "--brokers", kafka,
		"--window", rules.Window.String(), "--max-out-of-order", rules.MaxOutOfOrder.String(), "--max-future-skew", rules.MaxFutureSkew.String(),
		"--idle", "5s"}, &out, &out) // counted from before the first fetch: time for a loaded machine to start reading
	t.Logf("edgesim verify:\n%s", lastLines(out.String(), 12))
	if status != 0 {
		t.Errorf("verify: status %d", status)
	}
}

// buildCmd builds a command of this module into dir.
func buildCmd(t *testing.T, dir, pkg, name string) string {
	t.Helper()
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	return bin
}

// startDevKafka runs devkafka in its own process and returns its address.
func startDevKafka(t *testing.T, bin string) string {
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
