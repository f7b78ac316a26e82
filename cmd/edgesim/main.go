// Command edgesim runs simulated device fleets against an MQTT broker and
// checks what reached Kafka against what they sent.
//
//	edgesim run --addr 127.0.0.1:1883 --devices 1000 --metrics 10 --rate 1 --duration 30s
//	edgesim run --scenario configs/sim/offline-replay.yaml --truth truth.jsonl
//	edgesim run --devices 50 --metrics 2 --rate 100 --readings 40000 --hold
//	edgesim verify --truth truth.jsonl --brokers 127.0.0.1:9092
//
// run prints a live progress line (sent/s, acked/s, errors, reconnects,
// buffered) and a final summary table; --truth writes the truth log (every
// reading attempted and whether it was acknowledged, as JSON lines). With
// --watch-pid it also samples that process's memory (VmRSS, VmHWM from
// /proc), to measure a gateway's footprint under load. --readings sends
// a fixed number of readings and stops; --hold connects every device and
// waits for a line on stdin before sampling, so that another process can
// measure the broker with the fleet connected and idle, then start the
// load (cmd/footprint does). verify reads the
// summaries topic (read_committed, highest revision per window) and
// reports, per device and in total, the windows expected, found, missing
// and unexpected, fields that differ, duplicates and order violations; it
// exits 1 on any mismatch.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgegate/edgegate/bridge/kafka"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

func main() {
	// sarama (verify reads Kafka with it) records metrics in go-metrics,
	// whose meters tick in a goroutine that never stops; edgesim does not
	// report them.
	kafka.DisableMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  edgesim run [flags]      simulate a fleet (edgesim run -h lists the flags)
  edgesim verify [flags]   compare a truth log with the summaries in Kafka
`

// stdin gives run --hold its start signal; tests replace it.
var stdin io.Reader = os.Stdin

// errMismatch is verify's finding that Kafka does not match the truth.
var errMismatch = errors.New("summaries do not match the truth log")

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = run(ctx, args[1:], stdout)
	case "verify":
		err = verify(ctx, args[1:], stdout)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errMismatch):
		fmt.Fprintf(stderr, "edgesim: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "edgesim: %v\n", err)
	return 2
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("edgesim run", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:1883", "MQTT broker address")
	devices := fs.Int("devices", 100, "simulated devices")
	metrics := fs.Int("metrics", 3, "metrics per device")
	rate := fs.Float64("rate", 1, "samples per device per second (each sample is one reading per metric)")
	qos := fs.Int("qos", 1, "MQTT QoS: 0, 1 or 2")
	form := fs.String("form", "bare", "payload form: bare, v+t, object, senml, mixed or sparkplug (Sparkplug B edge nodes; the gateway needs sparkplug.enabled)")
	duration := fs.Duration("duration", 30*time.Second, "how long to run")
	user := fs.String("user", "", "username for every device (empty: anonymous)")
	pass := fs.String("password", "", "password for every device")
	watch := fs.Int("watch-pid", 0, "sample this process's memory (Linux /proc)")
	scenario := fs.String("scenario", "", "run a scenario file (configs/sim/*.yaml) instead of the flags above; --duration overrides its own")
	truthPath := fs.String("truth", "", "write the truth log (JSON lines) to this file")
	speed := fs.Float64("speed", 1, "run the scenario this many times faster (every duration in it divided); scale the gateway's window settings alike")
	readings := fs.Int("readings", 0, "load mode: send exactly this many readings (a multiple of --devices × --metrics), then stop; --duration is then a time limit")
	hold := fs.Bool("hold", false, "connect every device, print \"connected N devices\", and start sampling only after a line (or end of file) on stdin; --duration counts from then")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	durationSet := false
	fs.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	var f *firmwaresim.Fleet
	if *readings < 0 || *readings > 0 && *scenario != "" {
		return errors.New("--readings needs load mode (no --scenario) and a count >= 1")
	}
	if *scenario != "" {
		sc, err := firmwaresim.LoadScenario(*scenario)
		if err != nil {
			return err
		}
		sc.Scale(*speed)
		f = sc.Fleet(*addr)
		if !durationSet {
			*duration = sc.Duration.D()
		}
		*devices = len(f.Devices)
		fmt.Fprintf(out, "scenario %s: %d devices, %d subscribers, %s\n", sc.Name, len(f.Devices), len(f.Subscribers), *duration)
	} else {
		var err error
		if f, err = flagFleet(*addr, *devices, *metrics, *rate, *qos, *form, *user, *pass); err != nil {
			return err
		}
		if *readings > 0 {
			per := *devices * *metrics
			if lower := *readings / per * per; lower == 0 {
				return fmt.Errorf("--readings %d: fewer than --devices × --metrics (%d); use %d or a multiple of it", *readings, per, per)
			} else if lower != *readings {
				return fmt.Errorf("--readings %d: not a multiple of --devices × --metrics (%d); use %d or %d", *readings, per, lower, lower+per)
			}
			for i := range f.Devices {
				f.Devices[i].Samples = *readings / per
			}
		}
	}
	if *truthPath != "" {
		tf, err := os.Create(*truthPath)
		if err != nil {
			return fmt.Errorf("truth log: %w", err)
		}
		bw := bufio.NewWriterSize(tf, 1<<20)
		f.Truth = &firmwaresim.Truth{W: bw}
		defer func() {
			if err := errors.Join(f.Truth.Err(), bw.Flush(), tf.Sync(), tf.Close()); err != nil {
				fmt.Fprintf(os.Stderr, "edgesim: truth log %s: %v\n", *truthPath, err)
			}
		}()
	}
	o := runOptions{duration: *duration, watch: *watch, readings: uint64(*readings)}
	if *hold {
		o.hold = stdin
	}
	return runFleet(ctx, f, o, out)
}

// flagFleet builds the load-mode fleet from the command-line flags.
func flagFleet(addr string, devices, metrics int, rate float64, qos int, form, user, pass string) (*firmwaresim.Fleet, error) {
	if devices < 1 || metrics < 1 || rate <= 0 || qos < 0 || qos > 2 {
		return nil, errors.New("need --devices >= 1, --metrics >= 1, --rate > 0, --qos 0..2")
	}
	forms := map[string]firmwaresim.Form{"bare": firmwaresim.FormBare, "v+t": firmwaresim.FormVT, "object": firmwaresim.FormObject, "senml": firmwaresim.FormSenML,
		"sparkplug": firmwaresim.FormSparkplug}
	f := &firmwaresim.Fleet{Addr: addr}
	for i := range devices {
		d := firmwaresim.Device{
			ID: fmt.Sprintf("sim-%05d", i+1), Username: user, Password: pass,
			Interval: time.Duration(float64(time.Second) / rate), QoS: byte(qos),
		}
		if form == "mixed" {
			d.Form = firmwaresim.Form(i % 4)
		} else if fm, ok := forms[form]; ok {
			d.Form = fm
		} else {
			return nil, fmt.Errorf("--form %q: use bare, v+t, object, senml, mixed or sparkplug", form)
		}
		env := firmwaresim.Environmental()
		for m := range metrics {
			mt := env[m%len(env)]
			if m >= len(env) {
				mt.Name = mt.Name + "_" + strconv.Itoa(m/len(env))
			}
			d.Metrics = append(d.Metrics, mt)
		}
		f.Devices = append(f.Devices, d)
	}
	return f, nil
}

// runOptions say how long runFleet runs and what it watches.
type runOptions struct {
	duration time.Duration // from the start of sampling
	watch    int           // a process whose memory to sample; 0 for none
	// readings, if set, ends the run once the fleet has sent that many
	// (each device stops by itself after its share); duration is then a
	// limit, and reaching it first is an error.
	readings uint64
	// hold, if set, holds the fleet until every device is connected and a
	// line (or the end) is read from it.
	hold io.Reader
}

// connectWait bounds how long a held fleet waits for its devices to
// connect.
const connectWait = time.Minute

// runFleet runs f for o.duration with a progress line every second, then
// prints the summary table.
func runFleet(ctx context.Context, f *firmwaresim.Fleet, o runOptions, out io.Writer) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var release chan struct{}
	if o.hold != nil {
		release = make(chan struct{})
		f.Hold = release
	}
	done := make(chan struct{})
	go func() { f.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	if o.hold != nil {
		if err := awaitStart(ctx, f, o.hold, out); err != nil {
			return err
		}
		close(release)
	}

	start := time.Now()
	limit := time.NewTimer(o.duration)
	defer limit.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// With a fixed number of readings, look for the end more often than
	// the progress line, so that the run ends soon after the last ack.
	var finished <-chan time.Time
	if o.readings > 0 {
		poll := time.NewTicker(10 * time.Millisecond)
		defer poll.Stop()
		finished = poll.C
	}
	var last firmwaresim.FleetStats
	var peakRSS, hwm uint64
	var runErr error
	for {
		select {
		case <-limit.C:
			if o.readings > 0 {
				runErr = fmt.Errorf("sent %d of the %d readings within --duration %s; raise --duration", f.Stats().Sent, o.readings, o.duration)
			}
			cancel()
			finished = nil
			continue
		case <-finished:
			if st := f.Stats(); st.Sent < o.readings || st.Buffered > 0 {
				continue
			}
			cancel()
			finished = nil
			continue
		case <-done:
			st := f.Stats()
			el := time.Since(start).Seconds()
			fmt.Fprintf(out, "\n%-22s %12s\n", "", "total")
			fmt.Fprintf(out, "%-22s %12.1f\n", "seconds", el)
			fmt.Fprintf(out, "%-22s %12d\n", "devices", len(f.Devices))
			fmt.Fprintf(out, "%-22s %12d\n", "readings sent", st.Sent)
			fmt.Fprintf(out, "%-22s %12.0f\n", "readings sent/s", float64(st.Sent)/el)
			fmt.Fprintf(out, "%-22s %12d\n", "readings acked", st.Acked)
			if st.Acked > 0 {
				fmt.Fprintf(out, "%-22s %12.1f\n", "PUBACK p50 ms", float64(f.AckLatency(0.5))/1e6)
				fmt.Fprintf(out, "%-22s %12.1f\n", "PUBACK p99 ms", float64(f.AckLatency(0.99))/1e6)
			}
			fmt.Fprintf(out, "%-22s %12d\n", "errors", st.Errors)
			fmt.Fprintf(out, "%-22s %12d\n", "connections", st.Connects)
			fmt.Fprintf(out, "%-22s %12d\n", "reconnect storms", st.Storms)
			fmt.Fprintf(out, "%-22s %12d\n", "left in buffers", st.Buffered)
			if len(f.Subscribers) > 0 {
				fmt.Fprintf(out, "%-22s %12d\n", "subscribers received", st.Received)
			}
			if rss, err := selfRSS(); err == nil {
				fmt.Fprintf(out, "%-22s %12.1f\n", "edgesim RSS MiB", float64(rss)/1024)
			}
			if o.watch != 0 {
				if _, h, err := procMem(o.watch); err == nil {
					hwm = h
				}
				fmt.Fprintf(out, "%-22s %12.1f\n", "watched RSS peak MiB", float64(max(peakRSS, hwm))/1024)
			}
			return runErr
		case <-tick.C:
			st := f.Stats()
			line := fmt.Sprintf("t=%3.0fs sent %8d (%6d/s) acked %8d (%6d/s) errors %d reconnects %d buffered %d",
				time.Since(start).Seconds(), st.Sent, st.Sent-last.Sent, st.Acked, st.Acked-last.Acked, st.Errors,
				st.Connects-min(st.Connects, uint64(len(f.Devices)+len(f.Subscribers))), st.Buffered)
			if o.watch != 0 {
				if rss, h, err := procMem(o.watch); err == nil {
					peakRSS, hwm = max(peakRSS, rss), h
					line += fmt.Sprintf(" | pid %d rss %.1f MiB peak %.1f MiB", o.watch, float64(rss)/1024, float64(h)/1024)
				}
			}
			fmt.Fprintln(out, line)
			last = st
		}
	}
}

// awaitStart waits until every device of the held fleet f is connected,
// says so, and then waits for a line or the end of start.
func awaitStart(ctx context.Context, f *firmwaresim.Fleet, start io.Reader, out io.Writer) error {
	want := uint64(len(f.Devices) + len(f.Subscribers))
	deadline := time.Now().Add(connectWait)
	for f.Stats().Connects < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d devices connected within %s: is the broker at --addr up, and does it take %d connections?",
				f.Stats().Connects, want, connectWait, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "connected %d devices\n", len(f.Devices))
	// The read cannot be cancelled; its goroutine ends with the read, at
	// the latest when the process exits.
	line := make(chan error, 1)
	go func() {
		_, err := bufio.NewReader(start).ReadString('\n')
		line <- err
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-line:
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read stdin for the start: %w", err)
		}
		return nil
	}
}

// selfRSS returns this process's VmRSS in KiB.
func selfRSS() (uint64, error) {
	rss, _, err := procMem(os.Getpid())
	return rss, err
}

// procMem returns VmRSS and VmHWM of pid in KiB.
func procMem(pid int) (rss, hwm uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss, _ = strconv.ParseUint(f[1], 10, 64)
		case "VmHWM:":
			hwm, _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	return rss, hwm, nil
}
