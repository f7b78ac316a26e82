package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

// fullHistory is an hour of samples of 100 devices and 8 dead-letter
// reasons: the most the history holds but for more reasons.
func fullHistory() (*history, status) {
	h := newHistory()
	var st status
	for i := range historyLen {
		st = fakeStatus(at0.Add(time.Duration(i)*historyStep), nil)
		for d := range maxDeviceMetrics {
			st.MQTT.DeviceList = append(st.MQTT.DeviceList, aggregate.DeviceStat{ID: fmt.Sprintf("device-%03d", d), Aggregated: uint64(i * 100)})
		}
		for r := range 8 {
			st.MQTT.DeadLetters[fmt.Sprintf("reason_%d", r)] = uint64(i)
		}
		h.add(st)
	}
	return h, st
}

// BenchmarkHistoryView is /api/history at its largest: the view and its
// JSON (reported as bytes/op of JSON in the custom metric).
func BenchmarkHistoryView(b *testing.B) {
	h, st := fullHistory()
	now := st.Now.Add(5 * time.Second)
	var n int
	for b.Loop() {
		out, err := json.Marshal(h.view(now))
		if err != nil {
			b.Fatal(err)
		}
		n = len(out)
	}
	b.ReportMetric(float64(n), "json-bytes")
}

// BenchmarkFigures is the figures of one /api/status or /metrics snapshot
// against a full history.
func BenchmarkFigures(b *testing.B) {
	h, st := fullHistory()
	st.Now = st.Now.Add(5 * time.Second)
	for b.Loop() {
		computeFigures(st, h)
	}
}
