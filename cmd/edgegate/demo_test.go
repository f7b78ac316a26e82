//go:build !nodemo

package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the first-run experience for 15 s with its defaults and
// checks that summaries appear before it stops, and that the closing tally
// adds up: every reading the fleet sent was aggregated, and every summary
// emitted reached Kafka.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("15 s")
	}
	var out, errb bytes.Buffer
	start := time.Now()
	err := runDemo(context.Background(), demoOptions{mqtt: "127.0.0.1:0", devices: 4, window: 10 * time.Second,
		interval: time.Second, duration: 15 * time.Second}, &out, &errb)
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
	m := regexp.MustCompile(`readings sent (\d+), aggregated (\d+), late revisions (\d+), dead letters (\d+); summaries emitted (\d+), delivered to Kafka (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no tally:\n%s", text)
	}
	n := make([]int, 7)
	for i := 1; i < 7; i++ {
		n[i], _ = strconv.Atoi(m[i])
	}
	if n[1] == 0 || n[1] != n[2] || n[3] != 0 || n[4] != 0 || n[5] == 0 || n[5] != n[6] {
		t.Errorf("tally does not add up: %s", m[0])
	}
	allRows := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d-\d\d:\d\d:\d\d  demo-00\d`).FindAllString(text, -1)
	if len(allRows) != n[5] {
		t.Errorf("%d rows shown, %d summaries delivered", len(allRows), n[5])
	}
}
