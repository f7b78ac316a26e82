package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
)

// runPipeline runs the whole pipeline (gateway, forwarder, HTTP endpoint
// on a free port) against kfake until the test ends, and requires a clean
// stop. The context ends with the test.
func runPipeline(t *testing.T, id string) (context.Context, *pipeline) {
	t.Helper()
	_, brokers := kafkatest.Start(t, 1, "edge.summaries", "edge.deadletter", "edge.offsets")
	cfg := configs.Default()
	cfg.Gateway.ID, cfg.Gateway.DataDir = id, t.TempDir()
	cfg.MQTT.Listen, cfg.MQTT.AllowAnonymous = "127.0.0.1:0", true
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Kafka.Brokers = brokers
	// The machine's clock, whatever its NTP: tests do not depend on it.
	cfg.Clock.Synchronized = "always"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ko, err := kafkaOptions(&cfg, id)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPipeline(&cfg, log, kafka.NewConnector(ko), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return ctx, p
}

// TestMetrics runs the pipeline, publishes 2 good readings and 3 bad
// payloads, and scrapes /metrics: the counters say exactly that, and the
// exposition passes Prometheus's linter. /readyz reports storage writable;
// edgegate status prints the same facts.
func TestMetrics(t *testing.T) {
	ctx, p := runPipeline(t, "metrics-gw")

	conn, err := net.Dial("tcp", p.gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "m-dev"})
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "m-dev", KeepAlive: 30, CleanStart: true}); err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(&paho.Disconnect{})
	for _, body := range []string{"21.5", "hot", "22", "warm", "cold"} {
		if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/m-dev/temp", QoS: 1, Payload: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + p.http.Addr().String() + "/metrics"
	var text string
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(b)
		// Publications are applied in order: once the last one (a
		// rejected payload) counts, every one does.
		if strings.Contains(text, `edgegate_payloads_rejected_total{reason="not_a_number"} 3`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		`edgegate_readings_total{outcome="aggregated"} 2`,
		`edgegate_readings_total{outcome="too_many_series"} 0`,
		`edgegate_series `,
		`edgegate_queue_deadletters_dropped_total 0`,
		`edgegate_queue_over_quota_total 0`,
		`edgegate_queue_deadletter_bytes `,
		`edgegate_payloads_rejected_total{reason="not_a_number"} 3`,
		`edgegate_payloads_rejected_total{reason="invalid_json"} 0`,
		`edgegate_publications_total 5`,
		`edgegate_quota_refused_total 0`,
		`edgegate_mqtt_refused_total{reason="write_timeout"} 0`,
		`edgegate_mqtt_refused_total{reason="receive_maximum"} 0`,
		`edgegate_mqtt_clients_connected 1`,
		`edgegate_journal_fsync_seconds_count `,
		`edgegate_device_last_seen_age_seconds{device="m-dev"} `,
		`edgegate_device_watermark_lag_seconds{device="m-dev"} `,
		`edgegate_devices_unlisted 0`,
		`edgegate_readings_not_allowed_total 0`,
		`edgegate_mqtt_sessions_evicted_total 0`,
		`edgegate_mqtt_refused_total{reason="client_id_not_allowed"} 0`,
		`edgegate_mqtt_refused_total{reason="session_limit"} 0`,
		`edgegate_mqtt_refused_total{reason="websocket_origin"} 0`,
		`edgegate_queue_oldest_age_seconds `,
		`edgegate_kafka_batches_total `,
		`edgegate_kafka_refused_total 0`,
		`edgegate_kafka_batch_bytes `,
		`edgegate_kafka_refused_dropped_total 0`,
		`edgegate_kafka_refused_bytes `,
		`edgegate_clock_synchronized 1`,
		`edgegate_clock_steps_total 0`,
		`edgegate_clock_offset_seconds 0`,
		`edgegate_devices_clock_skewed 0`,
		`edgegate_clock_held_readings 0`,
		`edgegate_readings_unverified_total 0`,
		`edgegate_device_clock_unset_total{device="m-dev"} 0`,
		`edgegate_readings_total{outcome="device_clock_unset"} 0`,
		`process_resident_memory_bytes `,
		`go_goroutines `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	resp, err := http.Get("http://" + p.http.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"storage":"writable"`) || !strings.Contains(string(b), `"ready":true`) {
		t.Errorf("/readyz: %d %s", resp.StatusCode, b)
	}
	var out, errb strings.Builder
	if code := runMain(ctx, []string{"status", "--url", "http://" + p.http.Addr().String()}, &out, &errb); code != 0 {
		t.Fatalf("status: %d %s", code, errb.String())
	}
	for _, want := range []string{"gateway   metrics-gw (edgegate dev), up ", "mqtt      1 clients, 5 publications, 0 duplicates ignored, 0 refused at the quota",
		"readings  2 aggregated, 0 late revisions, 0 too late, 0 future, 0 evicted, 0 invalid, 0 over the series limits, 3 payloads refused",
		"clock     synchronized (assumed", ", no steps\n", "kafka     link ", " 0 lost, 0 refused (set aside), "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("edgegate status lacks %q:\n%s", want, out.String())
		}
	}
	problems, err := testutil.CollectAndLint(metricsCollector{p})
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
}
