package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The Prometheus text exposition format, version 0.0.4, written here
// rather than with the Prometheus client library: that library and the
// protobuf runtime it needs were a sixth of the ARM binary. The go_* and
// process_* families are those of the client library's default Go and
// process collectors, with the same names, types and meanings.
const expositionType = "text/plain; version=0.0.4; charset=utf-8"

// metricDesc describes a metric family: its name, help and label names.
type metricDesc struct {
	name, help string
	labels     []string
}

type metricType string

const (
	counterType   metricType = "counter"
	gaugeType     metricType = "gauge"
	histogramType metricType = "histogram"
	summaryType   metricType = "summary"
)

// exposition collects the samples of one scrape and writes them in the
// text format: families sorted by name, each with its HELP and TYPE once.
type exposition struct {
	fams map[string]*family
}

type family struct {
	d       *metricDesc
	typ     metricType
	samples []sample
}

// sample is one line: the family's name with suffix (_bucket, _sum,
// _count or none), label pairs, value.
type sample struct {
	suffix string
	labels []string // name, value, name, value...
	v      float64
}

func newExposition() *exposition { return &exposition{fams: map[string]*family{}} }

// family returns d's family, of type typ. A family used with two types, or
// values that do not match its labels, is a programming error.
func (e *exposition) family(d *metricDesc, typ metricType) *family {
	f, ok := e.fams[d.name]
	if !ok {
		f = &family{d: d, typ: typ}
		e.fams[d.name] = f
	}
	if f.typ != typ || f.d != d {
		panic(fmt.Sprintf("metric %s: used as %s and %s, or described twice", d.name, f.typ, typ))
	}
	return f
}

func (d *metricDesc) pairs(values []string) []string {
	if len(values) != len(d.labels) {
		panic(fmt.Sprintf("metric %s: %d label values for labels %v", d.name, len(values), d.labels))
	}
	p := make([]string, 0, 2*len(values))
	for i, v := range values {
		p = append(p, d.labels[i], v)
	}
	return p
}

func (e *exposition) counter(d *metricDesc, v float64, labelValues ...string) {
	f := e.family(d, counterType)
	f.samples = append(f.samples, sample{labels: d.pairs(labelValues), v: v})
}

func (e *exposition) gauge(d *metricDesc, v float64, labelValues ...string) {
	f := e.family(d, gaugeType)
	f.samples = append(f.samples, sample{labels: d.pairs(labelValues), v: v})
}

// histogram adds a histogram without labels: cumulative counts for each
// upper bound (ascending), then +Inf, _sum and _count.
func (e *exposition) histogram(d *metricDesc, count uint64, sum float64, bounds []float64, cumulative []uint64) {
	f := e.family(d, histogramType)
	for i, b := range bounds {
		f.samples = append(f.samples, sample{suffix: "_bucket", labels: []string{"le", formatFloat(b)}, v: float64(cumulative[i])})
	}
	f.samples = append(f.samples, sample{suffix: "_bucket", labels: []string{"le", "+Inf"}, v: float64(count)},
		sample{suffix: "_sum", v: sum}, sample{suffix: "_count", v: float64(count)})
}

// summary adds a summary without labels: the quantiles (ascending), _sum
// and _count.
func (e *exposition) summary(d *metricDesc, count uint64, sum float64, quantiles, values []float64) {
	f := e.family(d, summaryType)
	for i, q := range quantiles {
		f.samples = append(f.samples, sample{labels: []string{"quantile", formatFloat(q)}, v: values[i]})
	}
	f.samples = append(f.samples, sample{suffix: "_sum", v: sum}, sample{suffix: "_count", v: float64(count)})
}

// write writes the exposition. Counters' and gauges' samples are sorted
// by their label values; histograms and summaries keep their order.
func (e *exposition) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	names := make([]string, 0, len(e.fams))
	for n := range e.fams {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		f := e.fams[n]
		if f.typ == counterType || f.typ == gaugeType {
			slices.SortStableFunc(f.samples, func(a, b sample) int { return slices.Compare(a.labels, b.labels) })
		}
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", n, escapeHelp(f.d.help), n, f.typ)
		for _, s := range f.samples {
			bw.WriteString(n)
			bw.WriteString(s.suffix)
			if len(s.labels) > 0 {
				bw.WriteByte('{')
				for i := 0; i < len(s.labels); i += 2 {
					if i > 0 {
						bw.WriteByte(',')
					}
					fmt.Fprintf(bw, "%s=\"%s\"", s.labels[i], escapeLabel(s.labels[i+1]))
				}
				bw.WriteByte('}')
			}
			bw.WriteByte(' ')
			bw.WriteString(formatFloat(s.v))
			bw.WriteByte('\n')
		}
	}
	return bw.Flush()
}

// formatFloat writes a value as the Prometheus client library does.
func formatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, +1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// The Go runtime's families, as the client library's default Go collector
// names them; the memory ones from runtime/metrics, which, unlike
// runtime.ReadMemStats, does not stop the world.
var (
	goGoroutines = &metricDesc{name: "go_goroutines", help: "Number of goroutines that currently exist."}
	goThreads    = &metricDesc{name: "go_threads", help: "Number of OS threads created."}
	goGC         = &metricDesc{name: "go_gc_duration_seconds", help: "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles."}
	goLastGC     = &metricDesc{name: "go_memstats_last_gc_time_seconds", help: "Number of seconds since 1970 of last garbage collection."}
	goInfo       = &metricDesc{name: "go_info", help: "Information about the Go environment.", labels: []string{"version"}}
	goGOGC       = &metricDesc{name: "go_gc_gogc_percent", help: "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent."}
	goMemLimit   = &metricDesc{name: "go_gc_gomemlimit_bytes", help: "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes."}
	goMaxProcs   = &metricDesc{name: "go_sched_gomaxprocs_threads", help: "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads."}
)

// goMemStats are the go_memstats_* families: name, help, counter or
// gauge, and the runtime/metrics samples they add up.
var goMemStats = []struct {
	d       *metricDesc
	counter bool
	sum     []string
}{
	{&metricDesc{name: "go_memstats_alloc_bytes", help: "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes."}, false, []string{"/memory/classes/heap/objects:bytes"}},
	{&metricDesc{name: "go_memstats_alloc_bytes_total", help: "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes."}, true, []string{"/gc/heap/allocs:bytes"}},
	{&metricDesc{name: "go_memstats_buck_hash_sys_bytes", help: "Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes."}, false, []string{"/memory/classes/profiling/buckets:bytes"}},
	{&metricDesc{name: "go_memstats_frees_total", help: "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects."}, true, []string{"/gc/heap/frees:objects", "/gc/heap/tiny/allocs:objects"}},
	{&metricDesc{name: "go_memstats_gc_sys_bytes", help: "Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes."}, false, []string{"/memory/classes/metadata/other:bytes"}},
	{&metricDesc{name: "go_memstats_heap_alloc_bytes", help: "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes."}, false, []string{"/memory/classes/heap/objects:bytes"}},
	{&metricDesc{name: "go_memstats_heap_idle_bytes", help: "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes."}, false, []string{"/memory/classes/heap/released:bytes", "/memory/classes/heap/free:bytes"}},
	{&metricDesc{name: "go_memstats_heap_inuse_bytes", help: "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes"}, false, []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes"}},
	{&metricDesc{name: "go_memstats_heap_objects", help: "Number of currently allocated objects. Equals to /gc/heap/objects:objects."}, false, []string{"/gc/heap/objects:objects"}},
	{&metricDesc{name: "go_memstats_heap_released_bytes", help: "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes."}, false, []string{"/memory/classes/heap/released:bytes"}},
	{&metricDesc{name: "go_memstats_heap_sys_bytes", help: "Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes."}, false,
		[]string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes", "/memory/classes/heap/released:bytes", "/memory/classes/heap/free:bytes"}},
	{&metricDesc{name: "go_memstats_mallocs_total", help: "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects."}, true, []string{"/gc/heap/allocs:objects", "/gc/heap/tiny/allocs:objects"}},
	{&metricDesc{name: "go_memstats_mcache_inuse_bytes", help: "Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes."}, false, []string{"/memory/classes/metadata/mcache/inuse:bytes"}},
	{&metricDesc{name: "go_memstats_mcache_sys_bytes", help: "Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes."}, false, []string{"/memory/classes/metadata/mcache/inuse:bytes", "/memory/classes/metadata/mcache/free:bytes"}},
	{&metricDesc{name: "go_memstats_mspan_inuse_bytes", help: "Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes."}, false, []string{"/memory/classes/metadata/mspan/inuse:bytes"}},
	{&metricDesc{name: "go_memstats_mspan_sys_bytes", help: "Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes."}, false, []string{"/memory/classes/metadata/mspan/inuse:bytes", "/memory/classes/metadata/mspan/free:bytes"}},
	{&metricDesc{name: "go_memstats_next_gc_bytes", help: "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes."}, false, []string{"/gc/heap/goal:bytes"}},
	{&metricDesc{name: "go_memstats_other_sys_bytes", help: "Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes."}, false, []string{"/memory/classes/other:bytes"}},
	{&metricDesc{name: "go_memstats_stack_inuse_bytes", help: "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes."}, false, []string{"/memory/classes/heap/stacks:bytes"}},
	{&metricDesc{name: "go_memstats_stack_sys_bytes", help: "Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes."}, false, []string{"/memory/classes/heap/stacks:bytes", "/memory/classes/os-stacks:bytes"}},
	{&metricDesc{name: "go_memstats_sys_bytes", help: "Number of bytes obtained from system. Equals to /memory/classes/total:byte."}, false, []string{"/memory/classes/total:bytes"}},
}

// collectGo adds the Go runtime's families.
func collectGo(e *exposition) {
	e.gauge(goGoroutines, float64(runtime.NumGoroutine()))
	e.gauge(goThreads, float64(pprof.Lookup("threadcreate").Count()))
	var gc debug.GCStats
	gc.PauseQuantiles = make([]time.Duration, 5) // min, 25%, 50%, 75%, max
	debug.ReadGCStats(&gc)
	q := make([]float64, len(gc.PauseQuantiles))
	for i, d := range gc.PauseQuantiles {
		q[i] = d.Seconds()
	}
	e.summary(goGC, uint64(gc.NumGC), gc.PauseTotal.Seconds(), []float64{0, 0.25, 0.5, 0.75, 1}, q)
	e.gauge(goLastGC, float64(gc.LastGC.UnixNano())/1e9)
	e.gauge(goInfo, 1, runtime.Version())

	names := map[string]bool{"/gc/gogc:percent": true, "/gc/gomemlimit:bytes": true, "/sched/gomaxprocs:threads": true}
	for _, m := range goMemStats {
		for _, n := range m.sum {
			names[n] = true
		}
	}
	samples := make([]metrics.Sample, 0, len(names))
	for n := range names {
		samples = append(samples, metrics.Sample{Name: n})
	}
	metrics.Read(samples)
	value := map[string]float64{}
	for _, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			value[s.Name] = float64(s.Value.Uint64())
		}
	}
	for _, m := range goMemStats {
		var v float64
		for _, n := range m.sum {
			v += value[n]
		}
		if m.counter {
			e.counter(m.d, v)
		} else {
			e.gauge(m.d, v)
		}
	}
	e.gauge(goGOGC, value["/gc/gogc:percent"])
	e.gauge(goMemLimit, value["/gc/gomemlimit:bytes"])
	e.gauge(goMaxProcs, value["/sched/gomaxprocs:threads"])
}

// The process's families, as the client library's process collector names
// them, from /proc (Linux only; elsewhere they are left out).
var (
	procCPU      = &metricDesc{name: "process_cpu_seconds_total", help: "Total user and system CPU time spent in seconds."}
	procOpenFDs  = &metricDesc{name: "process_open_fds", help: "Number of open file descriptors."}
	procMaxFDs   = &metricDesc{name: "process_max_fds", help: "Maximum number of open file descriptors."}
	procVsize    = &metricDesc{name: "process_virtual_memory_bytes", help: "Virtual memory size in bytes."}
	procMaxVsize = &metricDesc{name: "process_virtual_memory_max_bytes", help: "Maximum amount of virtual memory available in bytes."}
	procRSS      = &metricDesc{name: "process_resident_memory_bytes", help: "Resident memory size in bytes."}
	procStart    = &metricDesc{name: "process_start_time_seconds", help: "Start time of the process since unix epoch in seconds."}
)

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// Linux architecture Go supports.
const userHZ = 100

// collectProcess adds the process's families; what cannot be read is left
// out.
func collectProcess(e *exposition) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if st, err := parseProcStat(string(b)); err == nil {
			e.counter(procCPU, float64(st.utime+st.stime)/userHZ)
			e.gauge(procVsize, float64(st.vsize))
			e.gauge(procRSS, float64(st.rss*uint64(os.Getpagesize())))
			if boot, err := bootTime(); err == nil {
				e.gauge(procStart, float64(boot)+float64(st.starttime)/userHZ)
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		e.gauge(procOpenFDs, float64(len(fds)-1)) // less the one ReadDir had open
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		e.gauge(procMaxFDs, float64(lim.Cur))
	}
	if syscall.Getrlimit(syscall.RLIMIT_AS, &lim) == nil {
		e.gauge(procMaxVsize, float64(lim.Cur))
	}
}

// procStat holds the fields of /proc/PID/stat the process families use.
type procStat struct {
	utime, stime, starttime, vsize, rss uint64
}

// parseProcStat reads a /proc/PID/stat line (proc(5)): the fields after
// the command name, which may hold spaces and parentheses, are counted
// from the last ')'.
func parseProcStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 22 {
		return procStat{}, fmt.Errorf("/proc stat: %d fields after the name, want 22 or more", len(f))
	}
	// Fields 14, 15, 22, 23 and 24 of proc(5); f[0] is field 3.
	var st procStat
	for _, x := range []struct {
		dst   *uint64
		field int
	}{{&st.utime, 14}, {&st.stime, 15}, {&st.starttime, 22}, {&st.vsize, 23}, {&st.rss, 24}} {
		v, err := strconv.ParseUint(f[x.field-3], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("/proc stat field %d: %w", x.field, err)
		}
		*x.dst = v
	}
	return st, nil
}

// bootTime is the system's boot time in seconds since the epoch: btime
// in /proc/stat.
func bootTime() (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/stat: no btime")
}
