// Command footprint compares what brokers cost on the same loads, side by
// side on one machine: mosquitto (no persistence), a plain mochi-mqtt
// broker (its defaults, every client allowed) and edgegate (its defaults,
// delivering to a Kafka-protocol broker), one after another, each load
// offered by edgesim in a process of its own. It prints a Markdown table:
// CPU per reading, peak and idle RSS, PUBACK p50/p99 at two rates, with
// ratios to the first broker (mosquitto), then each round's figures.
//
//	footprint [-short] [-rounds 2] [-bin DIR] [-brokers mosquitto,mochi,edgegate]
//	footprint mochi --listen 127.0.0.1:1883   the plain mochi broker it measures
//
// Rounds alternate the brokers (A B C A B C) for every measurement, and
// the table quotes medians: on a shared machine the ratios measured side
// by side are what counts. make bench-footprint builds everything and
// runs it; DIR (by default this program's own directory) holds the
// edgegate, edgesim and devkafka binaries.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgegate/edgegate/bridge/kafka"
)

func main() {
	// sarama (the summaries are counted in Kafka with it) records metrics
	// in go-metrics, whose meters tick in a goroutine that never stops.
	kafka.DisableMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && args[0] == "mochi" {
		err = runMochi(ctx, args[1:], stderr)
	} else {
		err = runBench(ctx, args, stdout, stderr)
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "footprint: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "footprint: %v\n", err)
	return 1
}

type usageError struct{ error }

// runMochi runs mochi-mqtt as it comes: default options and capabilities,
// every client allowed, one TCP listener; its log on stdout, as by
// default. It stops on SIGTERM.
func runMochi(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("footprint mochi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:1883", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	srv := mqtt.New(nil)
	if err := srv.AddHook(new(allowAll), nil); err != nil {
		return err
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: *listen})); err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	<-ctx.Done()
	return srv.Close()
}

// allowAll lets every client connect, publish and subscribe: what mochi's
// hooks/auth.AllowHook does, without the YAML dependency of its package.
type allowAll struct{ mqtt.HookBase }

func (allowAll) ID() string { return "allow-all" }
func (allowAll) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}
func (allowAll) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }
func (allowAll) OnACLCheck(*mqtt.Client, string, bool) bool              { return true }

// settings are the loads and how often each is run.
type settings struct {
	rounds     int
	cpu        loadSpec // CPU per reading
	memory     loadSpec // idle RSS before it starts, peak RSS, PUBACK at its rate
	latency    loadSpec // PUBACK at a higher rate
	idleSettle time.Duration
	runs       map[string]bool // which of memory, cpu and latency to make; all by default
}

// defaults are the loads: CPU on 50 devices × 2 metrics at 100
// readings/s each (10,000/s) for 40,000 readings; memory with 1,000
// devices × 10 metrics × 1/s for 70 s, so that a minute's windows close
// within it; PUBACK latency at that 10,000/s and at 30,000/s.
func defaults() settings {
	return settings{
		rounds:     2,
		cpu:        loadSpec{devices: 50, metrics: 2, rate: 100, readings: 40000},
		memory:     loadSpec{devices: 1000, metrics: 10, rate: 1, duration: 70 * time.Second},
		latency:    loadSpec{devices: 1000, metrics: 10, rate: 3, duration: 10 * time.Second},
		idleSettle: 5 * time.Second,
	}
}

// short is the quick check: one round, the same rates, short runs (no
// window closes in the memory run).
func short() settings {
	s := defaults()
	s.rounds = 1
	s.cpu.readings = 10000
	s.memory.duration = 8 * time.Second
	s.latency.duration = 4 * time.Second
	s.idleSettle = time.Second
	return s
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("footprint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	isShort := fs.Bool("short", false, "one round of short runs (under a minute); the flags below override it")
	binDir := fs.String("bin", "", "directory holding edgegate, edgesim and devkafka (default: this program's)")
	mosqBin := fs.String("mosquitto", "mosquitto", "the mosquitto broker (apt-get install -y mosquitto)")
	brokerList := fs.String("brokers", "mosquitto,mochi,edgegate", "brokers to compare, in order; ratios are to the first")
	runList := fs.String("runs", "memory,cpu,latency", "runs to make: memory (idle and peak RSS, PUBACK at its rate), cpu, latency")
	workDir := fs.String("dir", "", "where the brokers' files go, on the disk to measure (default: a new directory in $TMPDIR)")
	keep := fs.Bool("keep", false, "keep the brokers' files and logs")
	rounds := fs.Int("rounds", 0, "rounds (default 2; 1 with -short)")
	cpuDevices := fs.Int("cpu-devices", 0, "CPU load: devices (default 50)")
	cpuMetrics := fs.Int("cpu-metrics", 0, "CPU load: metrics per device (default 2)")
	cpuRate := fs.Float64("cpu-rate", 0, "CPU load: samples per device per second (default 100)")
	cpuReadings := fs.Int("cpu-readings", 0, "CPU load: readings (default 40000; 10000 with -short)")
	devices := fs.Int("devices", 0, "memory and latency loads: devices (default 1000)")
	metrics := fs.Int("metrics", 0, "memory and latency loads: metrics per device (default 10)")
	memRate := fs.Float64("memory-rate", 0, "memory load: samples per device per second (default 1)")
	memDuration := fs.Duration("memory-duration", 0, "memory load: duration (default 70s, so that a minute's windows close; 8s with -short)")
	latRate := fs.Float64("latency-rate", 0, "latency load: samples per device per second (default 3)")
	latDuration := fs.Duration("latency-duration", 0, "latency load: duration (default 10s; 4s with -short)")
	idleSettle := fs.Duration("idle-settle", 0, "wait after every device connected before reading the idle RSS (default 5s; 1s with -short)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (flags only; footprint -h lists them)", fs.Arg(0))}
	}
	s := defaults()
	if *isShort {
		s = short()
	}
	setInt := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setF := func(dst *float64, v float64) {
		if v != 0 {
			*dst = v
		}
	}
	setD := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	setInt(&s.rounds, *rounds)
	setInt(&s.cpu.devices, *cpuDevices)
	setInt(&s.cpu.metrics, *cpuMetrics)
	setF(&s.cpu.rate, *cpuRate)
	setInt(&s.cpu.readings, *cpuReadings)
	setInt(&s.memory.devices, *devices)
	setInt(&s.latency.devices, *devices)
	setInt(&s.memory.metrics, *metrics)
	setInt(&s.latency.metrics, *metrics)
	setF(&s.memory.rate, *memRate)
	setD(&s.memory.duration, *memDuration)
	setF(&s.latency.rate, *latRate)
	setD(&s.latency.duration, *latDuration)
	setD(&s.idleSettle, *idleSettle)
	s.runs = map[string]bool{}
	for _, r := range strings.Split(*runList, ",") {
		switch r = strings.TrimSpace(r); r {
		case "memory", "cpu", "latency":
			s.runs[r] = true
		default:
			return usageError{fmt.Errorf("-runs: unknown run %q; use memory, cpu and latency, comma-separated", r)}
		}
	}
	if err := s.validate(); err != nil {
		return usageError{err}
	}
	// With a fixed number of readings the duration is only a limit.
	s.cpu.duration = time.Duration(float64(s.cpu.readings)/s.cpu.offered()*10*float64(time.Second)) + time.Minute

	dir := *binDir
	if dir == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		dir = filepath.Dir(self)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	tools := map[string]string{}
	for _, name := range []string{"edgesim", "edgegate", "devkafka"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return usageError{fmt.Errorf("%s not found in %s: run make bench-footprint, which builds it, or point -bin at a directory holding edgegate, edgesim and devkafka", name, dir)}
		}
		tools[name] = p
	}
	var brokers []broker
	for _, name := range strings.Split(*brokerList, ",") {
		switch strings.TrimSpace(name) {
		case "mosquitto":
			p, err := exec.LookPath(*mosqBin)
			if err != nil {
				return usageError{fmt.Errorf("mosquitto not found (%v): apt-get install -y mosquitto, or leave it out with -brokers mochi,edgegate (ratios are then to mochi)", err)}
			}
			brokers = append(brokers, mosquitto{bin: p})
		case "mochi":
			brokers = append(brokers, mochi{self: self})
		case "edgegate":
			brokers = append(brokers, edgegate{bin: tools["edgegate"], devkafka: tools["devkafka"]})
		default:
			return usageError{fmt.Errorf("-brokers: unknown broker %q; use mosquitto, mochi and edgegate, comma-separated", name)}
		}
	}
	root := *workDir
	if root == "" {
		if root, err = os.MkdirTemp("", "footprint-"); err != nil {
			return err
		}
	} else if root, err = os.MkdirTemp(root, "footprint-"); err != nil {
		return fmt.Errorf("-dir: %w", err)
	}
	// The brokers run in their own directories: their paths must not be
	// relative to this one.
	if root, err = filepath.Abs(root); err != nil {
		return fmt.Errorf("-dir: %w", err)
	}
	if !*keep {
		defer os.RemoveAll(root)
	}
	b := &bench{s: s, brokers: brokers, edgesim: tools["edgesim"], root: root, progress: stderr,
		results: map[string][]measure{}}
	start := time.Now()
	fmt.Fprintf(stderr, "footprint: %d round(s) of %s; files in %s\n", s.rounds, strings.Join(b.names(), ", "), root)
	if err := b.run(ctx); err != nil {
		if !*keep {
			fmt.Fprintf(stderr, "footprint: rerun with -keep to keep the brokers' logs\n")
		}
		return err
	}
	b.print(stdout, time.Since(start))
	return nil
}

func (s settings) validate() error {
	var errs []error
	for _, l := range []struct {
		name string
		l    loadSpec
	}{{"cpu", s.cpu}, {"memory", s.memory}, {"latency", s.latency}} {
		if l.l.devices < 1 || l.l.metrics < 1 || l.l.rate <= 0 {
			errs = append(errs, fmt.Errorf("%s load: need devices >= 1, metrics >= 1 and a rate > 0", l.name))
		}
	}
	if s.cpu.readings < 1 || s.cpu.readings%(s.cpu.devices*max(1, s.cpu.metrics)) != 0 {
		errs = append(errs, fmt.Errorf("-cpu-readings %d: need a multiple of -cpu-devices × -cpu-metrics (%d)", s.cpu.readings, s.cpu.devices*s.cpu.metrics))
	}
	if s.memory.duration <= 0 || s.latency.duration <= 0 || s.idleSettle < 0 {
		errs = append(errs, errors.New("-memory-duration and -latency-duration must be > 0, -idle-settle >= 0"))
	}
	if s.rounds < 1 {
		errs = append(errs, errors.New("-rounds must be >= 1"))
	}
	return errors.Join(errs...)
}

// bench runs the rounds and keeps what they measured.
type bench struct {
	s        settings
	brokers  []broker
	edgesim  string
	root     string
	progress io.Writer
	results  map[string][]measure // by broker name, one per round
	// kept for the notes
	cpuWindows, memWindows []int // edgegate's summaries per CPU and memory run
}

func (b *bench) names() []string {
	var n []string
	for _, br := range b.brokers {
		n = append(n, br.name())
	}
	return n
}

func (b *bench) run(ctx context.Context) error {
	phases := []struct {
		name string
		run  func(context.Context, broker, string, *measure) error
	}{{"memory", b.memoryRun}, {"cpu", b.cpuRun}, {"latency", b.latencyRun}}
	for round := 1; round <= b.s.rounds; round++ {
		ms := make([]measure, len(b.brokers))
		for _, ph := range phases {
			if !b.s.runs[ph.name] {
				continue
			}
			for i, br := range b.brokers {
				dir := filepath.Join(b.root, fmt.Sprintf("r%d-%s-%s", round, ph.name, br.name()))
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				if err := ph.run(ctx, br, dir, &ms[i]); err != nil {
					return fmt.Errorf("round %d, %s run of %s: %w", round, ph.name, br.name(), err)
				}
			}
		}
		for i, br := range b.brokers {
			b.results[br.name()] = append(b.results[br.name()], ms[i])
		}
	}
	return nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "  "+format+"\n", args...)
}

// memoryRun starts a fresh broker, connects the memory load's devices and
// reads the idle RSS, then runs the load and reads the peak.
func (b *bench) memoryRun(ctx context.Context, br broker, dir string, m *measure) error {
	srv, err := br.start(dir)
	if err != nil {
		return err
	}
	defer srv.kill()
	ld, err := startLoad(ctx, b.edgesim, srv.addr, b.s.memory)
	if err != nil {
		return err
	}
	defer ld.kill()
	if err := sleep(ctx, b.s.idleSettle); err != nil {
		return err
	}
	idle, _, err := memory(srv.main.pid())
	if err != nil {
		return err
	}
	if err := ld.start(); err != nil {
		return err
	}
	res, err := ld.wait()
	if err != nil {
		return err
	}
	_, peak, err := memory(srv.main.pid())
	if err != nil {
		return err
	}
	st, err := srv.stop(ctx)
	if err != nil {
		return err
	}
	m.idleRSS, m.peakRSS = mib(idle), mib(peak)
	m.p50Mem, m.p99Mem, m.rateMem = res.p50, res.p99, res.rate
	m.errors += res.errors
	m.summaries += st.summaries
	if srv.kafka != nil {
		b.memWindows = append(b.memWindows, st.summaries)
	}
	b.logf("memory  %-9s idle %6.1f MiB  peak %6.1f MiB  PUBACK p50 %5.1f ms p99 %5.1f ms at %s readings/s%s",
		br.name(), m.idleRSS, m.peakRSS, res.p50, res.p99, thousands(res.rate), summariesNote(srv, st))
	return nil
}

// cpuRun starts a fresh broker, connects the CPU load's devices, and
// counts the broker's CPU from the load's start to the broker's exit after
// SIGTERM (for edgegate: its windows closed and delivered to Kafka).
func (b *bench) cpuRun(ctx context.Context, br broker, dir string, m *measure) error {
	srv, err := br.start(dir)
	if err != nil {
		return err
	}
	defer srv.kill()
	ld, err := startLoad(ctx, b.edgesim, srv.addr, b.s.cpu)
	if err != nil {
		return err
	}
	defer ld.kill()
	c0, k0, err := srv.cpu()
	if err != nil {
		return err
	}
	if err := ld.start(); err != nil {
		return err
	}
	res, err := ld.wait()
	if err != nil {
		return err
	}
	st, err := srv.stop(ctx)
	if err != nil {
		return err
	}
	if res.acked == 0 {
		return fmt.Errorf("no reading acknowledged")
	}
	m.cpuReadings = res.acked
	m.cpuPerReading = float64((st.cpu - c0).Nanoseconds()) / 1e3 / float64(res.acked)
	if srv.kafka != nil {
		m.kafkaPerReading = float64((st.kafkaCPU - k0).Nanoseconds()) / 1e3 / float64(res.acked)
		b.cpuWindows = append(b.cpuWindows, st.summaries)
	}
	m.errors += res.errors
	m.summaries += st.summaries
	b.logf("cpu     %-9s %6.1f µs per reading (%s readings acknowledged, %s/s)%s", br.name(), m.cpuPerReading,
		thousands(float64(res.acked)), thousands(res.rate), summariesNote(srv, st))
	return nil
}

// latencyRun starts a fresh broker and reads the PUBACK latency under the
// latency load.
func (b *bench) latencyRun(ctx context.Context, br broker, dir string, m *measure) error {
	srv, err := br.start(dir)
	if err != nil {
		return err
	}
	defer srv.kill()
	ld, err := startLoad(ctx, b.edgesim, srv.addr, b.s.latency)
	if err != nil {
		return err
	}
	defer ld.kill()
	if err := ld.start(); err != nil {
		return err
	}
	res, err := ld.wait()
	if err != nil {
		return err
	}
	st, err := srv.stop(ctx)
	if err != nil {
		return err
	}
	m.p50Lat, m.p99Lat, m.rateLat = res.p50, res.p99, res.rate
	m.errors += res.errors
	m.summaries += st.summaries
	b.logf("latency %-9s PUBACK p50 %5.1f ms p99 %5.1f ms at %s readings/s%s", br.name(), res.p50, res.p99, thousands(res.rate), summariesNote(srv, st))
	return nil
}

func summariesNote(srv *server, st stopped) string {
	if srv.kafka == nil {
		return ""
	}
	return fmt.Sprintf("; %s summaries in Kafka", thousands(float64(st.summaries)))
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// print writes the table and what its figures include.
func (b *bench) print(w io.Writer, took time.Duration) {
	s := b.s
	var headers []string
	for _, br := range b.brokers {
		headers = append(headers, br.version())
	}
	rows := []row{
		{run: "cpu", label: "CPU per reading, " + s.cpu.String(), unit: "µs", digits: 1, ratio: true, get: func(m measure) float64 { return m.cpuPerReading }},
		{run: "memory", label: "peak RSS, " + s.memory.String(), unit: "MiB", digits: 1, ratio: true, get: func(m measure) float64 { return m.peakRSS }},
		{run: "memory", label: "idle RSS, " + thousands(float64(s.memory.devices)) + " devices connected", unit: "MiB", digits: 1, ratio: true, get: func(m measure) float64 { return m.idleRSS }},
		{run: "memory", label: "PUBACK p50, " + thousands(s.memory.offered()) + " readings/s offered", unit: "ms", ratio: true, ms: true, get: func(m measure) float64 { return m.p50Mem }},
		{run: "memory", label: "PUBACK p99, " + thousands(s.memory.offered()) + " readings/s offered", unit: "ms", ratio: true, ms: true, get: func(m measure) float64 { return m.p99Mem }},
		{run: "latency", label: "PUBACK p50, " + thousands(s.latency.offered()) + " readings/s offered", unit: "ms", ratio: true, ms: true, get: func(m measure) float64 { return m.p50Lat }},
		{run: "latency", label: "PUBACK p99, " + thousands(s.latency.offered()) + " readings/s offered", unit: "ms", ratio: true, ms: true, get: func(m measure) float64 { return m.p99Lat }},
		{run: "latency", label: "achieved, " + thousands(s.latency.offered()) + " readings/s offered", unit: "readings/s", digits: 0, get: func(m measure) float64 { return m.rateLat }},
	}
	fmt.Fprintf(w, "footprint: %d round(s), brokers alternating for every measurement; medians, and in brackets the median of the per-round ratios to %s (of an even number, the geometric mean of the middle two)\n",
		s.rounds, b.brokers[0].name())
	fmt.Fprintf(w, "machine: %d CPUs, %s/%s; took %s\n\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, took.Round(time.Second))
	rows = slices.DeleteFunc(rows, func(r row) bool { return !s.runs[r.run] })
	printTable(w, b.names(), headers, b.results, rows)
	fmt.Fprintf(w, `
Loads: edgesim in its own process on the same machine, MQTT 5, QoS 1, a bare number per publication (one reading), each device publishing one at a time; the PUBACK time is the client's, to 0.1 ms, up to 100 ms. Where fewer readings/s are achieved than offered, the load generator (sharing the machine) or the broker is the limit.
CPU per reading: the broker process's utime+stime from the load's start (every device connected) to its exit after SIGTERM, over the readings acknowledged. Peak RSS: VmHWM after the memory load (its start included). Idle RSS: VmRSS %s after the memory load's devices connected, before it starts. Each run starts a fresh broker.
`, s.idleSettle)
	for _, br := range b.brokers {
		if _, ok := br.(edgegate); !ok {
			continue
		}
		var kafkaCPU []float64
		for _, m := range b.results[br.name()] {
			kafkaCPU = append(kafkaCPU, m.kafkaPerReading)
		}
		fmt.Fprintf(w, "edgegate: its defaults (journal with fsync every 5 ms before each PUBACK, per-minute windows, checkpoints, the HTTP endpoint), anonymous devices each limited to its own readings; its CPU includes delivering the summaries to Kafka (exactly-once transactions, zstd) up to its exit, which closes and delivers the open windows: summaries read back from Kafka per CPU run %v, per memory run %v. The Kafka-protocol broker (devkafka, kfake) runs in its own process and is not counted: %s µs per reading more (median).\n",
			b.cpuWindows, b.memWindows, format(median(kafkaCPU), 1))
	}
	var errs uint64
	for _, ms := range b.results {
		for _, m := range ms {
			errs += m.errors
		}
	}
	if errs > 0 {
		fmt.Fprintf(w, "The loads met %d connection or publish errors (see each broker's log with -keep).\n", errs)
	}
}
