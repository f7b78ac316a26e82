package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/broker"
	"github.com/edgegate/edgegate/gateway/payload"
)

// runPipeline runs the whole pipeline (gateway, forwarder, HTTP endpoint
// on a free port) against kfake until the test ends, and requires a clean
// stop. The context ends with the test.
func runPipeline(t *testing.T, id string) (context.Context, *pipeline) {
	t.Helper()
	return runPipelineWith(t, id, nil)
}

// runPipelineWith is runPipeline with the configuration changed by edit
// before it is validated.
func runPipelineWith(t *testing.T, id string, edit func(*configs.Config)) (context.Context, *pipeline) {
	t.Helper()
	_, brokers := kafkatest.Start(t, 1, "edge.summaries", "edge.deadletter", "edge.offsets")
	cfg := configs.Default()
	cfg.Gateway.ID, cfg.Gateway.DataDir = id, t.TempDir()
	cfg.MQTT.Listen, cfg.MQTT.AllowAnonymous = "127.0.0.1:0", true
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Kafka.Brokers = brokers
	// The machine's clock, whatever its NTP: tests do not depend on it.
	cfg.Clock.Synchronized = "always"
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ko, err := kafkaOptions(&cfg, id)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPipeline(&cfg, log, ko, time.Now)
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
	for deadline := time.Now().Add(30 * time.Second); ; { // for a hang, not a slow machine
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
		`edgegate_mqtt_refused_total{reason="retained_limit"} 0`,
		`edgegate_mqtt_retained_messages 0`,
		`edgegate_mqtt_retained_bytes 0`,
		`edgegate_mqtt_queued_bytes 0`,
		`edgegate_mqtt_queued_dropped_total{reason="session_bytes"} 0`,
		`edgegate_mqtt_queued_dropped_total{reason="total_bytes"} 0`,
		`edgegate_mqtt_refused_total{reason="client_id_not_allowed"} 0`,
		`edgegate_mqtt_refused_total{reason="session_limit"} 0`,
		`edgegate_mqtt_refused_total{reason="websocket_origin"} 0`,
		`edgegate_queue_oldest_age_seconds `,
		`edgegate_kafka_batches_total `,
		`edgegate_kafka_refused_total 0`,
		`edgegate_kafka_position_errors_total 0`,
		`edgegate_kafka_config_warnings 0`,
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
		`edgegate_mqtt_listener_accepting{listener="tcp"} 1`,
		`edgegate_mqtt_accept_errors_total{listener="tcp"} 0`,
		`edgegate_mqtt_sockets_pending `,
		`edgegate_mqtt_sockets_max `,
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
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"storage":"writable"`) || !strings.Contains(string(b), `"ready":true`) ||
		!strings.Contains(string(b), `"mqtt_listeners":"accepting"`) {
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
	// The exposition is one the Prometheus libraries parse and lint
	// clean, with every family of the client library's default Go and
	// process collectors, which /metrics served before it was written
	// here.
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	for _, name := range []string{"go_gc_duration_seconds", "go_gc_gogc_percent", "go_gc_gomemlimit_bytes", "go_goroutines", "go_info",
		"go_memstats_alloc_bytes", "go_memstats_alloc_bytes_total", "go_memstats_buck_hash_sys_bytes", "go_memstats_frees_total",
		"go_memstats_gc_sys_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_inuse_bytes",
		"go_memstats_heap_objects", "go_memstats_heap_released_bytes", "go_memstats_heap_sys_bytes", "go_memstats_last_gc_time_seconds",
		"go_memstats_mallocs_total", "go_memstats_mcache_inuse_bytes", "go_memstats_mcache_sys_bytes", "go_memstats_mspan_inuse_bytes",
		"go_memstats_mspan_sys_bytes", "go_memstats_next_gc_bytes", "go_memstats_other_sys_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_stack_sys_bytes", "go_memstats_sys_bytes", "go_sched_gomaxprocs_threads", "go_threads",
		"process_cpu_seconds_total", "process_max_fds", "process_open_fds", "process_resident_memory_bytes",
		"process_start_time_seconds", "process_virtual_memory_bytes", "process_virtual_memory_max_bytes",
		"edgegate_journal_fsync_seconds"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks the family %s", name)
		}
	}
	if f := fams["go_memstats_sys_bytes"]; f != nil && f.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("go_memstats_sys_bytes = %v", f.GetMetric()[0].GetGauge().GetValue())
	}
	if f := fams["process_resident_memory_bytes"]; f != nil && f.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("process_resident_memory_bytes = %v", f.GetMetric()[0].GetGauge().GetValue())
	}
	if f := fams["edgegate_journal_fsync_seconds"]; f != nil && f.GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
		t.Errorf("no fsync counted in %v", f)
	}
}

// TestSparkplugMetrics: an NBIRTH and an NDATA after a seq gap show in
// /metrics as one online edge node, the messages, the readings, the gap
// and the rebirth request; an NDEATH of the session then takes it offline.
func TestSparkplugMetrics(t *testing.T) {
	ctx, p := runPipelineWith(t, "sp-gw", func(c *configs.Config) { c.Sparkplug.Enabled = true })
	conn, err := net.Dial("tcp", p.gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "n1"})
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "n1", KeepAlive: 30, CleanStart: true}); err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(&paho.Disconnect{})
	v := func(x float64) payload.SparkplugOut {
		return payload.SparkplugOut{Name: "t", Alias: 1, HasAlias: true, Datatype: payload.SpDouble, Kind: payload.SpDoubleValue, Bits: math.Float64bits(x)}
	}
	bd := payload.SparkplugOut{Name: "bdSeq", Datatype: payload.SpUInt64, Kind: payload.SpLongValue, Bits: 2}
	for _, m := range []struct {
		topic string
		body  []byte
	}{
		{"spBv1.0/g/NBIRTH/n1", payload.AppendSparkplug(nil, 0, 0, []payload.SparkplugOut{bd, v(1)})},
		{"spBv1.0/g/NDATA/n1", payload.AppendSparkplug(nil, 0, 5, []payload.SparkplugOut{v(2)})}, // seq 1 expected
	} {
		if _, err := c.Publish(ctx, &paho.Publish{Topic: m.topic, QoS: 1, Payload: m.body}); err != nil {
			t.Fatal(err)
		}
	}
	scrape := func(until string) string {
		var text string
		for deadline := time.Now().Add(30 * time.Second); ; { // for a hang, not a slow machine
			resp, err := http.Get("http://" + p.http.Addr().String() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			text = string(b)
			if strings.Contains(text, until) || time.Now().After(deadline) {
				return text
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	text := scrape(`edgegate_sparkplug_messages_total{type="NDATA"} 1`)
	for _, want := range []string{
		`edgegate_sparkplug_nodes{state="online"} 1`,
		`edgegate_sparkplug_nodes{state="offline"} 0`,
		`edgegate_sparkplug_messages_total{type="NBIRTH"} 1`,
		`edgegate_sparkplug_messages_total{type="NDATA"} 1`,
		`edgegate_sparkplug_readings_total 2`,
		`edgegate_sparkplug_problems_total{kind="seq_gap"} 1`,
		`edgegate_sparkplug_rebirth_requests_total{result="made"} 1`,
		`edgegate_sparkplug_metrics_ignored_total{why="protocol"} 1`,
		`edgegate_readings_total{outcome="aggregated"} 2`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "spBv1.0/g/NDEATH/n1", QoS: 1, Payload: payload.AppendSparkplug(nil, 0, -1, []payload.SparkplugOut{bd})}); err != nil {
		t.Fatal(err)
	}
	text = scrape(`edgegate_sparkplug_nodes{state="offline"} 1`)
	if !strings.Contains(text, `edgegate_sparkplug_nodes{state="offline"} 1`) || !strings.Contains(text, `edgegate_sparkplug_deaths_total{result="ended"} 1`) {
		t.Errorf("after the NDEATH, /metrics lacks the offline node:\n%s", text)
	}
	if problems, err := promlint.New(strings.NewReader(text)).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestListenersReady: /readyz fails, saying why, while a listener does
// not accept.
func TestListenersReady(t *testing.T) {
	ok := broker.ListenerStatus{ID: "tcp", Address: "0.0.0.0:1883", Accepting: true}
	down := broker.ListenerStatus{ID: "tls", Address: "0.0.0.0:8883", FailingFor: 4200 * time.Millisecond, AcceptErrors: 9,
		LastError: "accept tcp [::]:8883: accept4: too many open files"}
	for name, tc := range map[string]struct {
		ls   []broker.ListenerStatus
		why  string
		want bool
	}{
		"none":      {nil, "accepting", true},
		"accepting": {[]broker.ListenerStatus{ok}, "accepting", true},
		"one down": {[]broker.ListenerStatus{ok, down}, "tls listener 0.0.0.0:8883 not accepting for 4s: accept tcp [::]:8883: accept4: too many open files",
			false},
	} {
		t.Run(name, func(t *testing.T) {
			why, ready := listenersReady(tc.ls)
			if why != tc.why || ready != tc.want {
				t.Errorf("listenersReady: %q %v; want %q %v", why, ready, tc.why, tc.want)
			}
		})
	}
}
