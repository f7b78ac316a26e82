package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// measure is what one round measured of one broker. Zero values are
// phases not run.
type measure struct {
	cpuPerReading   float64 // µs, the broker's process
	kafkaPerReading float64 // µs, devkafka's (edgegate only; not in cpuPerReading)
	cpuReadings     uint64  // readings acknowledged in the CPU phase
	idleRSS         float64 // MiB
	peakRSS         float64 // MiB
	p50Mem, p99Mem  float64 // ms, PUBACK under the memory load
	rateMem         float64 // readings/s achieved under the memory load
	p50Lat, p99Lat  float64 // ms, PUBACK under the latency load
	rateLat         float64 // readings/s achieved under the latency load
	summaries       int     // edgegate: summaries read back from Kafka, over the round's runs
	errors          uint64  // the load's connection and publish errors, over the round's runs
}

// row is one line of the table: a quantity measured of every broker.
type row struct {
	run    string // the run that measures it: memory, cpu or latency
	label  string
	unit   string
	digits int
	get    func(measure) float64
	ratio  bool // with ratios to the first broker
	ms     bool // a PUBACK quantile: edgesim's cap is marked
}

func (r row) format(v float64) string {
	switch {
	case r.ms:
		return formatMs(v)
	case r.digits == 0 && !math.IsNaN(v):
		return thousands(v)
	}
	return format(v, r.digits)
}

// median returns the median of xs (the mean of the middle two for an even
// count); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianRatio is median for ratios: of an even count, the geometric mean
// of the middle two, so that 4× and 0.25× make 1×, not 2.1×.
func medianRatio(xs []float64) float64 {
	if len(xs) == 0 || len(xs)%2 == 1 {
		return median(xs)
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	return math.Sqrt(s[n/2-1] * s[n/2])
}

// cell is a broker's figure in a row: the median over the rounds, and
// the median of its per-round ratios to the reference broker's figure
// (the rounds pair the brokers measured side by side).
func cell(r row, rounds []measure, ref []measure) (value, ratio float64) {
	var vs, rs []float64
	for i, m := range rounds {
		v := r.get(m)
		vs = append(vs, v)
		if ref != nil && i < len(ref) {
			if base := r.get(ref[i]); base > 0 {
				rs = append(rs, v/base)
			}
		}
	}
	return median(vs), medianRatio(rs)
}

// latencyCap is where edgesim's PUBACK histogram ends: a quantile there
// is at least that.
const latencyCap = 100.0 // ms

func format(v float64, digits int) string {
	if math.IsNaN(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', digits, 64)
}

// formatMs formats a PUBACK quantile, marking edgesim's cap.
func formatMs(v float64) string {
	if v >= latencyCap {
		return "≥ " + format(latencyCap, 0)
	}
	return format(v, 1)
}

// printTable writes the comparison as a Markdown table, then each
// round's figures so that the noise can be seen.
func printTable(w io.Writer, names, headers []string, results map[string][]measure, rows []row) {
	fmt.Fprintf(w, "| |")
	for _, h := range headers {
		fmt.Fprintf(w, " %s |", h)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(headers)))
	ref := results[names[0]]
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |", r.label)
		for i, name := range names {
			v, ratio := cell(r, results[name], ref)
			s := r.format(v) + " " + r.unit
			if r.ratio && i > 0 && !math.IsNaN(ratio) && (!r.ms || v < latencyCap) {
				s += " (" + format(ratio, 2) + "×)"
			}
			fmt.Fprintf(w, " %s |", strings.TrimSpace(s))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nEach round (%s):\n", strings.Join(names, ", "))
	for _, r := range rows {
		fmt.Fprintf(w, "  %-58s", r.label+" ("+r.unit+")")
		for _, name := range names {
			var vs []string
			for _, m := range results[name] {
				vs = append(vs, r.format(r.get(m)))
			}
			fmt.Fprintf(w, "  %-16s", strings.Join(vs, " "))
		}
		fmt.Fprintln(w)
	}
}

// thousands formats a count with thousands separators: 40000 → 40,000.
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
