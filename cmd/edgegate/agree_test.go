package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	dto "github.com/prometheus/client_model/go"
)

// TestViewsAgree: /api/status, /metrics and `edgegate status` show one
// snapshot, and agree on every figure the page shows: the link's state,
// queued and delivered records, the drain state, readings a minute, late
// revisions and too-late readings per device, and dead letters by reason.
// (The page draws /api/status as it comes; statuscharts_test.go checks
// what it draws.)
func TestViewsAgree(t *testing.T) {
	ctx, p := runPipeline(t, "agree-gw")
	for i, dev := range []string{"agree-1", "agree-2"} {
		conn, err := net.Dial("tcp", p.gw.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: dev})
		if _, err := c.Connect(ctx, &paho.Connect{ClientID: dev, KeepAlive: 30, CleanStart: true}); err != nil {
			t.Fatal(err)
		}
		defer c.Disconnect(&paho.Disconnect{})
		for j := range 5 + 5*i {
			if _, err := c.Publish(ctx, &paho.Publish{Topic: "sensors/" + dev + "/temp", QoS: 1, Payload: []byte(fmt.Sprint(20 + j))}); err != nil {
				t.Fatal(err)
			}
		}
		// An hour-old reading: a late revision (within the default
		// allowed lateness), per device.
		old := fmt.Sprintf(`{"v": 1, "t": %q}`, time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
		c.Publish(ctx, &paho.Publish{Topic: "sensors/" + dev + "/temp", QoS: 1, Payload: []byte(old)})
		c.Publish(ctx, &paho.Publish{Topic: "sensors/" + dev + "/temp", QoS: 1, Payload: []byte("scorching")})
	}
	// Readings a minute need 10 s of history, and every publication
	// applied.
	var st status
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st = p.status()
		d := st.MQTT.DeviceList
		if len(d) == 2 && len(st.Figures.Devices) == 2 && d[1].Aggregated == 10 && st.MQTT.DeadLetters["not_a_number"] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no figures for the 2 devices after a minute: %+v, %+v", d, st.Figures.Devices)
		}
	}

	// /api/status, as edgegate status and the page read it.
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var api status
	if err := json.Unmarshal(b, &api); err != nil {
		t.Fatal(err)
	}
	// /metrics from the same snapshot.
	e := newExposition()
	collect(e, st)
	var text strings.Builder
	e.write(&text)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text.String()))
	if err != nil {
		t.Fatal(err)
	}
	metric := func(name string, labels ...string) (float64, bool) {
		f, ok := fams["edgegate_"+name]
		if !ok {
			return 0, false
		}
	next:
		for _, m := range f.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				if label(m, labels[i]) != labels[i+1] {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue(), true
			}
			return m.Counter.GetValue(), true
		}
		return 0, false
	}
	// edgegate status from the JSON.
	var cli strings.Builder
	printStatus(&cli, api)
	out := cli.String()

	fg := api.Figures
	if v, _ := metric("kafka_link_state", "state", string(fg.Link.State)); v != 1 || fg.Link.State != st.Kafka.Link {
		t.Errorf("link state: /api/status %q, /metrics %v", fg.Link.State, v)
	}
	if !strings.Contains(out, "kafka     link "+fg.Link.Text+"\n") {
		t.Errorf("edgegate status lacks the link %q:\n%s", fg.Link.Text, out)
	}
	if v, _ := metric("queue_records"); v != float64(api.Kafka.Queued) {
		t.Errorf("queued: /api/status %d, /metrics %v", api.Kafka.Queued, v)
	}
	if v, _ := metric("queue_delivered_total"); v != float64(api.Kafka.Delivered) {
		t.Errorf("delivered: /api/status %d, /metrics %v", api.Kafka.Delivered, v)
	}
	if !strings.Contains(out, fmt.Sprintf("%d records queued (", api.Kafka.Queued)) || !strings.Contains(out, fmt.Sprintf(", %d delivered in ", api.Kafka.Delivered)) {
		t.Errorf("edgegate status: queued %d, delivered %d:\n%s", api.Kafka.Queued, api.Kafka.Delivered, out)
	}
	eta, _ := metric("queue_drain_eta_seconds")
	if want := fg.Drain.etaMetric(); eta != want && !(math.IsNaN(eta) && math.IsNaN(want)) {
		t.Errorf("drain ETA: /api/status %q (%v), /metrics %v", fg.Drain.State, want, eta)
	}
	if !strings.Contains(out, "drain     "+fg.Drain.Text+"\n") {
		t.Errorf("edgegate status lacks the drain %q:\n%s", fg.Drain.Text, out)
	}
	for i, d := range api.MQTT.DeviceList {
		want := uint64(5 + 5*i)
		if d.Aggregated != want || d.Revised != 1 || d.TooLate != 0 {
			t.Errorf("%s: %d aggregated, %d late revisions, %d too late; sent %d, 1 and 0", d.ID, d.Aggregated, d.Revised, d.TooLate, want)
		}
		f, ok := fg.Devices[d.ID]
		if !ok || f.ReadingsPerMin == nil {
			t.Errorf("%s: no readings a minute after %v", d.ID, minRateSpan)
			continue
		}
		if v, _ := metric("device_readings_per_minute", "device", d.ID); v != *f.ReadingsPerMin {
			t.Errorf("%s readings/min: /api/status %v, /metrics %v", d.ID, *f.ReadingsPerMin, v)
		}
		if v, _ := metric("device_too_late_total", "device", d.ID); v != float64(d.TooLate) {
			t.Errorf("%s too late: /api/status %d, /metrics %v", d.ID, d.TooLate, v)
		}
		if v, _ := metric("device_late_revisions_total", "device", d.ID); v != float64(d.Revised) {
			t.Errorf("%s late revisions: /api/status %d, /metrics %v", d.ID, d.Revised, v)
		}
		// The page's cell is f.Text: the same figure, and what it is
		// over when that is not the last minute.
		figure, over, _ := strings.Cut(f.Text, " ")
		if over != "" {
			over = " " + over
		}
		line := fmt.Sprintf("device    %s: %s readings/min%s, %d readings, %d late revisions, %d too late,", d.ID,
			figure, over, d.Aggregated+d.Revised, d.Revised, d.TooLate)
		if !strings.Contains(out, line) {
			t.Errorf("edgegate status lacks %q:\n%s", line, out)
		}
	}
	if len(api.MQTT.DeadLetters) != 1 || api.MQTT.DeadLetters["not_a_number"] != 2 {
		t.Errorf("dead letters %v; sent 2 not_a_number", api.MQTT.DeadLetters)
	}
	for r, n := range api.MQTT.DeadLetters {
		if v, _ := metric("deadletters_total", "reason", r); v != float64(n) {
			t.Errorf("dead letters %s: /api/status %d, /metrics %v", r, n, v)
		}
		if !strings.Contains(out, fmt.Sprintf(" %s %d", r, n)) {
			t.Errorf("edgegate status lacks dead letters %s %d:\n%s", r, n, out)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
