package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for name, tc := range map[string]struct {
		in   []float64
		want float64
	}{
		"one":  {[]float64{3}, 3},
		"odd":  {[]float64{9, 1, 5}, 5},
		"even": {[]float64{4, 1, 3, 10}, 3.5},
	} {
		t.Run(name, func(t *testing.T) {
			if got := median(tc.in); got != tc.want {
				t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

// TestCellRatiosPerRound: the ratio is the median of the per-round ratios
// (each round measured side by side), not the ratio of the medians.
func TestCellRatiosPerRound(t *testing.T) {
	r := row{get: func(m measure) float64 { return m.cpuPerReading }}
	ref := []measure{{cpuPerReading: 10}, {cpuPerReading: 20}, {cpuPerReading: 40}}
	b := []measure{{cpuPerReading: 30}, {cpuPerReading: 20}, {cpuPerReading: 60}}
	v, ratio := cell(r, b, ref)
	// Per round: 3, 1, 1.5; their median 1.5. The medians' ratio would be 30/20.
	if v != 30 || ratio != 1.5 {
		t.Errorf("cell = %v (%v×), want 30 (1.5×)", v, ratio)
	}
	// Of two rounds, the geometric mean of the ratios: 4× and 0.25× are 1×.
	if v, ratio := cell(r, []measure{{cpuPerReading: 40}, {cpuPerReading: 5}}, []measure{{cpuPerReading: 10}, {cpuPerReading: 20}}); v != 22.5 || ratio != 1 {
		t.Errorf("two rounds: cell = %v (%v×), want 22.5 (1×)", v, ratio)
	}
	if _, ratio := cell(r, b, []measure{{}, {}, {}}); !math.IsNaN(ratio) {
		t.Errorf("ratio to zeros = %v, want none", ratio)
	}
}

func TestPrintTable(t *testing.T) {
	results := map[string][]measure{
		"a": {{cpuPerReading: 10, p99Mem: 2}, {cpuPerReading: 12, p99Mem: 4}},
		"b": {{cpuPerReading: 25, p99Mem: 150}, {cpuPerReading: 24, p99Mem: 150}},
	}
	rows := []row{
		{label: "CPU", unit: "µs", digits: 1, ratio: true, get: func(m measure) float64 { return m.cpuPerReading }},
		{label: "p99", unit: "ms", ratio: true, ms: true, get: func(m measure) float64 { return m.p99Mem }},
		{label: "count", unit: "readings/s", get: func(m measure) float64 { return 12345.6 }},
	}
	var out strings.Builder
	printTable(&out, []string{"a", "b"}, []string{"A 1.0", "B 2.0"}, results, rows)
	// The ratios are 2.5 and 2: their geometric mean is √5.
	want := `| | A 1.0 | B 2.0 |
|---|---|---|
| CPU | 11.0 µs | 24.5 µs (2.24×) |
| p99 | 3.0 ms | ≥ 100 ms |
| count | 12,346 readings/s | 12,346 readings/s |
`
	if got := out.String(); !strings.HasPrefix(got, want) {
		t.Errorf("table:\n%s\nwant it to start with:\n%s", got, want)
	}
	if !strings.Contains(out.String(), "  CPU (µs)") || !strings.Contains(out.String(), "10.0 12.0") || !strings.Contains(out.String(), "25.0 24.0") {
		t.Errorf("no per-round figures:\n%s", out.String())
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 40000: "40,000", 1234567: "1,234,567", -1500: "-1,500", 9999.6: "10,000"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestLoadSpec(t *testing.T) {
	l := loadSpec{devices: 50, metrics: 2, rate: 100, readings: 40000, duration: time.Minute}
	if l.offered() != 10000 || l.String() != "50 devices × 2 metrics × 100/s, 40,000 readings" {
		t.Errorf("%v offers %v", l, l.offered())
	}
	want := "run --addr h:1 --devices 50 --metrics 2 --rate 100 --qos 1 --form bare --hold --duration 1m0s --readings 40000"
	if got := strings.Join(l.args("h:1"), " "); got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	if s := (loadSpec{devices: 1000, metrics: 10, rate: 1, duration: 70 * time.Second}).String(); s != "1,000 devices × 10 metrics × 1/s, 1m10s" {
		t.Errorf("String() = %q", s)
	}
}

// TestFlagErrors: bad flags are refused before anything starts, naming
// the fix.
func TestFlagErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"unknown run":      {[]string{"-runs", "memory,disk"}, `-runs: unknown run "disk"; use memory, cpu and latency, comma-separated`},
		"readings":         {[]string{"-cpu-readings", "101"}, "-cpu-readings 101: need a multiple of -cpu-devices × -cpu-metrics (100)"},
		"rounds":           {[]string{"-rounds", "-1"}, "-rounds must be >= 1"},
		"argument":         {[]string{"now"}, `unexpected argument "now"`},
		"no binaries here": {[]string{"-bin", t.TempDir()}, "edgesim not found in "},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb strings.Builder
			if code := runMain(context.Background(), tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, %q; want 2 and %q", code, errb.String(), tc.want)
			}
		})
	}
}
