package main

import (
	"math"
	"strings"
	"testing"
)

// TestExpositionFormat: families sorted by name, each with HELP and TYPE
// once and its samples grouped even when added interleaved, label values
// and help escaped, values as the Prometheus client writes them, a
// histogram's cumulative buckets ending in +Inf.
func TestExpositionFormat(t *testing.T) {
	e := newExposition()
	up := &metricDesc{name: "x_up", help: "1 if up.\nSecond line \\ here.", labels: []string{"sensor", "device"}}
	polls := &metricDesc{name: "x_polls_total", help: "Polls.", labels: []string{"sensor", "device"}}
	lat := &metricDesc{name: "x_latency_seconds", help: "Latency."}
	// Interleaved, as the collector adds them per sensor.
	e.gauge(up, 1, "b", `dev "2"`)
	e.counter(polls, 3, "b", `dev "2"`)
	e.gauge(up, 0, "a", "dev\\1\n")
	e.counter(polls, 1e21, "a", "dev\\1\n")
	e.histogram(lat, 5, 0.0125, []float64{0.001, 0.01}, []uint64{2, 4})
	e.gauge(&metricDesc{name: "x_inf", help: "Infinite."}, math.Inf(1))
	var out strings.Builder
	if err := e.write(&out); err != nil {
		t.Fatal(err)
	}
	want := `# HELP x_inf Infinite.
# TYPE x_inf gauge
x_inf +Inf
# HELP x_latency_seconds Latency.
# TYPE x_latency_seconds histogram
x_latency_seconds_bucket{le="0.001"} 2
x_latency_seconds_bucket{le="0.01"} 4
x_latency_seconds_bucket{le="+Inf"} 5
x_latency_seconds_sum 0.0125
x_latency_seconds_count 5
# HELP x_polls_total Polls.
# TYPE x_polls_total counter
x_polls_total{sensor="a",device="dev\\1\n"} 1e+21
x_polls_total{sensor="b",device="dev \"2\""} 3
# HELP x_up 1 if up.\nSecond line \\ here.
# TYPE x_up gauge
x_up{sensor="a",device="dev\\1\n"} 0
x_up{sensor="b",device="dev \"2\""} 1
`
	if got := out.String(); got != want {
		t.Errorf("exposition:\n%s\nwant:\n%s", got, want)
	}
}

// TestExpositionMisuse: a family used as two types, or given the wrong
// number of label values, is a programming error caught at once.
func TestExpositionMisuse(t *testing.T) {
	d := &metricDesc{name: "x", help: "X.", labels: []string{"a"}}
	for name, f := range map[string]func(e *exposition){
		"two types":       func(e *exposition) { e.gauge(d, 1, "v"); e.counter(d, 1, "v") },
		"too few labels":  func(e *exposition) { e.gauge(d, 1) },
		"too many labels": func(e *exposition) { e.gauge(d, 1, "v", "w") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f(newExposition())
		})
	}
}

func TestParseProcStat(t *testing.T) {
	line := "77 (edge gate) (x) S 1 77 77 0 -1 4194560 900 0 0 0 250 37 0 0 20 0 12 0 4321 1309024256 4760 18446744073709551615 1 1 0 0 0 0 0 0 0\n"
	st, err := parseProcStat(line)
	want := procStat{utime: 250, stime: 37, starttime: 4321, vsize: 1309024256, rss: 4760}
	if err != nil || st != want {
		t.Errorf("parseProcStat = %+v, %v; want %+v", st, err, want)
	}
	if _, err := parseProcStat("77 (x) S 1 2 3"); err == nil {
		t.Error("short line parsed")
	}
}
