//go:build !nodemo

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDemo runs the first-run experience for 20 s with its defaults and
// checks that summaries appear before it stops, and that the closing tally
// adds up: every reading the fleet sent was aggregated, and every summary
// emitted reached Kafka. The first window closes up to 13 s after the
// devices start (a 10 s window, 2 s out of order, a reading a second), so
// 20 s leaves a loaded machine time to start, deliver and show it (15 s
// left it a second or two).
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("20 s")
	}
	var out, errb bytes.Buffer
	start := time.Now()
	err := runDemo(context.Background(), demoOptions{mqtt: "127.0.0.1:0", devices: 4, window: 10 * time.Second,
		interval: time.Second, duration: 20 * time.Second, malformed: 0.3}, &out, &errb)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, errb.String())
	}
	text := out.String()
	before, _, ok := strings.Cut(text, "stopping:")
	if !ok {
		t.Fatalf("no stopping line:\n%s", text)
	}
	rows := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d-\d\d:\d\d:\d\d  demo-00\d`).FindAllString(before, -1)
	if len(rows) == 0 {
		t.Errorf("no summary shown within %v:\n%s", time.Since(start), text)
	}
	m := regexp.MustCompile(`readings sent (\d+), aggregated (\d+), late revisions (\d+); malformed payloads sent (\d+), dead letters (\d+); summaries emitted (\d+); records delivered to Kafka (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no tally:\n%s", text)
	}
	n := make([]int, 8)
	for i := 1; i < 8; i++ {
		n[i], _ = strconv.Atoi(m[i])
	}
	// Every reading aggregated; every malformed payload (the last device
	// sends some) one dead letter; every summary and dead letter delivered.
	if n[1] == 0 || n[1] != n[2] || n[3] != 0 || n[4] == 0 || n[4] != n[5] || n[6] == 0 || n[6]+n[5] != n[7] {
		t.Errorf("tally does not add up: %s", m[0])
	}
	allRows := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d-\d\d:\d\d:\d\d  demo-00\d`).FindAllString(text, -1)
	if len(allRows) != n[6] {
		t.Errorf("%d rows shown, %d summaries delivered", len(allRows), n[6])
	}
}

// lockedBuffer is a bytes.Buffer a test can read while the demo writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDemoServesStatusPage: the demo prints the status page's URL with
// the others, and serves the page, /metrics and /api/status with the
// demo's own data while it runs.
func TestDemoServesStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("8 s")
	}
	var out, errb lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- runDemo(context.Background(), demoOptions{mqtt: "127.0.0.1:0", http: "127.0.0.1:0", devices: 3, window: 2 * time.Second,
			interval: 200 * time.Millisecond, duration: 8 * time.Second}, &out, &errb)
	}()
	urlRe := regexp.MustCompile(`Status page  (http://127\.0\.0\.1:\d+)/ `)
	var base string
	for deadline := time.Now().Add(5 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := urlRe.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		t.Fatalf("no status page URL printed:\n%s", out.String())
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b)
	}
	if page := get("/"); !strings.Contains(page, `id="devices"`) {
		t.Errorf("/ is not the status page:\n%.300s", page)
	}
	// The demo's devices show up in the gateway's own figures.
	var st struct {
		Gateway string
		MQTT    struct{ DeviceList []struct{ ID string } }
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		json.Unmarshal([]byte(get("/api/status")), &st)
		if len(st.MQTT.DeviceList) == 3 {
			break
		}
	}
	if st.Gateway != "demo-gw" || len(st.MQTT.DeviceList) != 3 {
		t.Errorf("/api/status: gateway %q with %d devices, want demo-gw with the demo's 3", st.Gateway, len(st.MQTT.DeviceList))
	}
	if m := get("/metrics"); !strings.Contains(m, `edgegate_readings_total{outcome="aggregated"}`) {
		t.Errorf("/metrics has no aggregated readings:\n%.500s", m)
	}
	if err := <-done; err != nil {
		t.Fatalf("demo: %v\n%s", err, errb.String())
	}
}
