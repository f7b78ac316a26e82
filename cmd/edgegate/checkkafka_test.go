package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// kafkaConfig writes a config whose data_dir is a new directory and whose
// kafka.brokers are brokers.
func kafkaConfig(t *testing.T, brokers ...string) (path, dataDir string) {
	t.Helper()
	dir := t.TempDir()
	dataDir = filepath.Join(dir, "data")
	path = filepath.Join(dir, "edgegate.yaml")
	yaml := "gateway:\n  data_dir: " + dataDir + "\nmqtt:\n  listen: 127.0.0.1:1883\n  allow_anonymous: true\nkafka:\n  brokers: [" + strings.Join(brokers, ", ") + "]\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, dataDir
}

// TestCheckKafka: `edgegate check --kafka` runs the gateway's start-up
// probe and prints each step; it exits 0 only when every step passed,
// and before the first start it checks an id of the gateway's own form
// without writing the id file.
func TestCheckKafka(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, "edge.summaries", "edge.deadletter", "edge.offsets")
	path, dataDir := kafkaConfig(t, brokers...)
	code, out, errs := run(t, "check", "--config", path, "--kafka")
	if code != 0 || errs != "" {
		t.Fatalf("check --kafka on a good cluster: code %d, stderr %q\n%s", code, errs, out)
	}
	for _, want := range []string{
		"ok   reachable: 1 of 1 brokers answered (" + brokers[0] + ")",
		"ok   authenticated: no SASL configured (kafka.sasl)",
		"ok   topics: edge.summaries, edge.deadletter, edge.offsets present",
		"ok   offsets topic: edge.offsets compacted",
		"ok   transactional id: coordinator of edgegate-",
		"# Kafka is ready for this gateway",
		"the transactional id is checked as edgegate-",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "gateway-id")); !os.IsNotExist(err) {
		t.Errorf("check --kafka wrote the gateway id file (or could not tell): %v", err)
	}
}

// TestCheckKafkaFails: a missing topic and a broker that is not there
// each exit 1 with the reason and the fix; the steps after the failed one
// are not checked.
func TestCheckKafkaFails(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, "edge.summaries", "edge.offsets")
	path, _ := kafkaConfig(t, brokers...)
	code, out, errs := run(t, "check", "--config", path, "--kafka")
	if code != 1 || !strings.Contains(out, "FAIL topics: ") || !strings.Contains(errs, "kafka probe failed at topics") ||
		!strings.Contains(errs, "edge.deadletter") || !strings.Contains(errs, "kafka-topics.sh") || !strings.Contains(out, "--   offsets topic") {
		t.Errorf("missing topic: code %d\nstdout:\n%s\nstderr: %s", code, out, errs)
	}

	dead := kafkatest.Addr(kafkatest.FreePort(t))
	path, _ = kafkaConfig(t, dead)
	code, out, errs = run(t, "check", "--config", path, "--kafka")
	if code != 1 || !strings.Contains(out, "FAIL reachable: ") || !strings.Contains(errs, dead) || !strings.Contains(out, "--   authenticated") {
		t.Errorf("no broker: code %d\nstdout:\n%s\nstderr: %s", code, out, errs)
	}
	// Without --kafka, the same config is valid: the probe is asked for.
	if code, _, errs := run(t, "check", "--config", path); code != 0 {
		t.Errorf("check without --kafka: code %d, stderr %q", code, errs)
	}
}
