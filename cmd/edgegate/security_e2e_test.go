//go:build e2e

package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs/testpki"
)

// TestSecurityInterop drives the built binary's security with Debian's
// mosquitto_pub: passwords set by `edgegate passwd`, MQTT 3.1.1 and 5,
// TLS with a client certificate as the device's identity, the ACL, and a
// user added while running, taken up on SIGHUP. The counters on /metrics
// must match what the clients saw.
func TestSecurityInterop(t *testing.T) {
	need(t, "mosquitto_pub")
	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	users := filepath.Join(dir, "users")
	passwd := func(user, pw string, extra ...string) {
		t.Helper()
		cmd := exec.Command(bin, append(append([]string{"passwd"}, extra...), users, user)...)
		cmd.Stdin = strings.NewReader(pw + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("edgegate passwd %s: %v\n%s", user, err, out)
		}
	}
	passwd("dev-1", "pw-1", "-c")

	ca := testpki.New(t, "devices")
	srvCert, srvKey, _ := ca.Issue("gateway", true)
	devCert, devKey, _ := ca.Issue("dev-2", false)
	plain := fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	secure := fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	httpAddr := fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	cfg := filepath.Join(dir, "edgegate.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`gateway: {id: sec, data_dir: %s}
mqtt:
  listen: "%s"
  users_file: %s
  tls: {listen: "%s", cert_file: %s, key_file: %s, client_ca_file: %s}
kafka: {brokers: ["127.0.0.1:9"]}
clock: {synchronized: always} # tests do not depend on the machine's NTP
http: {listen: "%s"}
`, t.TempDir(), plain, users, secure, srvCert, srvKey, ca.File, httpAddr)), 0o600)
	var stderr bytes.Buffer
	gw := exec.Command(bin, "run", "--config", cfg)
	gw.Stderr = &stderr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		gw.Process.Signal(syscall.SIGTERM)
		gw.Wait()
		if t.Failed() {
			t.Logf("gateway log:\n%s", stderr.String())
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", plain); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway never listened")
		}
	}

	pub := func(args ...string) (string, error) {
		cmd := exec.Command("mosquitto_pub", append([]string{"-q", "1", "-m", "21.5"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	host, port, _ := net.SplitHostPort(plain)
	_, tport, _ := net.SplitHostPort(secure)
	tlsArgs := []string{"-h", host, "-p", tport, "-i", "dev-2:pub", "--cafile", ca.File, "--cert", devCert, "--key", devKey}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
		want string // in mosquitto_pub's output
	}{
		{"3.1.1 with password", []string{"-h", host, "-p", port, "-V", "mqttv311", "-u", "dev-1", "-i", "dev-1:pub", "-P", "pw-1", "-t", "sensors/dev-1/temp"}, true, ""},
		{"5 with password", []string{"-h", host, "-p", port, "-V", "mqttv5", "-u", "dev-1", "-i", "dev-1:pub", "-P", "pw-1", "-t", "sensors/dev-1/temp"}, true, ""},
		{"wrong password", []string{"-h", host, "-p", port, "-V", "mqttv311", "-u", "dev-1", "-i", "dev-1:pub", "-P", "nope", "-t", "sensors/dev-1/temp"}, false, "not authorised"},
		{"anonymous", []string{"-h", host, "-p", port, "-V", "mqttv5", "-t", "sensors/dev-1/temp"}, false, "Bad user name or password"},
		{"client certificate", append(tlsArgs, "-V", "mqttv5", "-t", "sensors/dev-2/temp"), true, ""},
		{"certificate under another device", append(tlsArgs, "-V", "mqttv5", "-t", "sensors/dev-1/temp"), true, "Not authorized"},
		{"not yet added", []string{"-h", host, "-p", port, "-u", "dev-3", "-i", "dev-3", "-P", "pw-3", "-t", "sensors/dev-3/temp"}, false, "not authorised"},
	} {
		out, err := pub(tc.args...)
		if (err == nil) != tc.ok || !strings.Contains(strings.ToLower(out), strings.ToLower(tc.want)) {
			t.Errorf("%s: mosquitto_pub %v, output %q; want ok=%v and %q", tc.name, err, out, tc.ok, tc.want)
		}
	}

	// A device added while running logs in after SIGHUP.
	passwd("dev-3", "pw-3")
	gw.Process.Signal(syscall.SIGHUP)
	early := 0 // tries before the gateway had reloaded
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := pub("-h", host, "-p", port, "-u", "dev-3", "-i", "dev-3", "-P", "pw-3", "-t", "sensors/dev-3/temp")
		if err == nil {
			break
		}
		early++
		if time.Now().After(deadline) {
			t.Fatalf("dev-3 after SIGHUP: %v %s", err, out)
		}
	}

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metric := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("no %s in /metrics", name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if got := metric(`edgegate_mqtt_refused_total{reason="bad_credentials"}`); got != 3+early {
		t.Errorf("bad_credentials %d, want %d", got, 3+early)
	}
	if got := metric(`edgegate_mqtt_refused_total{reason="publish_not_authorized"}`); got != 1 {
		t.Errorf("publish_not_authorized %d, want 1", got)
	}
	if got := metric(`edgegate_readings_total{outcome="aggregated"}`); got != 4 {
		t.Errorf("aggregated %d readings, want 4 (dev-1 twice, dev-2, dev-3)", got)
	}
}
