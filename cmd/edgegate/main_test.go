package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgegate/edgegate/gateway"
	"go.uber.org/goleak"

	"github.com/edgegate/edgegate/bridge/kafka"
)

func TestMain(m *testing.M) {
	kafka.DisableMetrics() // as main does
	// toxiproxy, the end-to-end tests' link between clients and the
	// gateway, leaves a link's two goroutines blocked on a channel when
	// its proxy is stopped (a cut) while bytes are on their way: they
	// belong to the test harness, not to anything edgegate started.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"))
}

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runMain(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheck(t *testing.T) {
	code, out, errs := run(t, "check", "--config", "../../configs/testdata/minimal.good.yaml")
	if code != 0 || !strings.Contains(out, "is valid") || !strings.Contains(out, "summaries_topic: edge.summaries") {
		t.Errorf("check good: code %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, "check", "--config", "../../configs/testdata/unknown-key.bad.yaml")
	want := "edgegate: config ../../configs/testdata/unknown-key.bad.yaml: mqtt.listn: unknown key (line 3); did you mean mqtt.listen?\n"
	if code != 1 || out != "" || errs != want {
		t.Errorf("check bad: code %d stdout %q stderr %q, want 1 and %q", code, out, errs, want)
	}
	if code, _, errs := run(t, "check"); code != 2 || !strings.Contains(errs, "--config FILE is required") {
		t.Errorf("check without --config: code %d stderr %q", code, errs)
	}
}

func TestRunBadConfigIsOneLine(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("mqtt:\n  allow_anonymous: true\naggregate:\n  window: soon\nkafka:\n  brokers: [k:9092]\n"), 0o600)
	code, _, errs := run(t, "run", "--config", bad)
	if code != 1 || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, `aggregate.window: "soon" is not a duration`) {
		t.Errorf("code %d stderr %q", code, errs)
	}
	missing := filepath.Join(dir, "users.yaml")
	os.WriteFile(missing, []byte("gateway:\n  data_dir: "+dir+"\nmqtt:\n  users_file: "+filepath.Join(dir, "nope")+"\nkafka:\n  brokers: [k:9092]\n"), 0o600)
	if code, _, errs := run(t, "run", "--config", missing); code != 1 || !strings.Contains(errs, "mqtt.users_file: open ") {
		t.Errorf("missing users file: code %d stderr %q", code, errs)
	}
}

// TestDataDirInUse: a second gateway on a data_dir that one is using stops
// at once with a one-line reason, before touching the directory's files.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	lock, err := gateway.LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	cfg := filepath.Join(dir, "edgegate.yaml")
	os.WriteFile(cfg, []byte("gateway: {data_dir: "+dir+"}\nmqtt: {listen: \"127.0.0.1:0\", allow_anonymous: true}\nkafka: {brokers: [\"127.0.0.1:9\"]}\nhttp: {listen: \"\"}\n"), 0o600)
	code, _, errs := run(t, "run", "--config", cfg)
	want := "edgegate: gateway.data_dir " + dir + " is in use by another edgegate (pid " + strconv.Itoa(os.Getpid()) + ")"
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if code != 1 || !strings.HasPrefix(lines[len(lines)-1], want) {
		t.Errorf("code %d stderr %q, want 1 and a last line %q...", code, errs, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "outbound")); err == nil {
		t.Error("the refused gateway created the outbound queue")
	}
}

// TestSensorsScan lists the emulated bus: each chip named as the driver
// identifies it (id register, CRC-checked status, address and power-on).
func TestSensorsScan(t *testing.T) {
	code, out, errs := run(t, "sensors", "scan", "--bus", "emulated")
	want := "bus emulated: 3 device(s)\n" +
		"  0x23  BH1750 (no id register: by address and power-on)\n" +
		"  0x44  SHT3x (status 0x0010, CRC ok)\n" +
		"  0x76  BME280 (chip id 0x60)\n"
	if code != 0 || out != want {
		t.Errorf("code %d\n%s%s\nwant\n%s", code, out, errs, want)
	}
	if code, _, errs := run(t, "sensors", "scan", "--bus", "no-such-bus"); code != 1 || !strings.Contains(errs, `open i2c bus "no-such-bus": not found`) {
		t.Errorf("unknown bus: code %d %q", code, errs)
	}
	if code, _, _ := run(t, "sensors", "scan"); code != 2 {
		t.Errorf("no --bus: code %d, want 2", code)
	}
}

func TestUnknownCommand(t *testing.T) {
	if code, _, errs := run(t, "frobnicate"); code != 2 || !strings.Contains(errs, `unknown command "frobnicate"`) {
		t.Errorf("code %d stderr %q", code, errs)
	}
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "edgegate dev (go") {
		t.Errorf("version: %d %q", code, out)
	}
}
