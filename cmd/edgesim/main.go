// Command edgesim runs simulated device fleets against an MQTT broker.
//
//	edgesim run --addr 127.0.0.1:1883 --devices 1000 --metrics 10 --rate 1 --duration 30s
//
// prints a live progress line (sent/s, acked/s, errors, connections) and a
// final summary. With --watch-pid it also samples that process's memory
// (VmRSS, VmHWM from /proc), to measure a gateway's footprint under load.
package main

import (
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

	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprintln(os.Stderr, "usage: edgesim run [flags]   (edgesim run -h lists them)")
		os.Exit(2)
	}
	if err := run(ctx, os.Args[2:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "edgesim: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("edgesim run", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:1883", "MQTT broker address")
	devices := fs.Int("devices", 100, "simulated devices")
	metrics := fs.Int("metrics", 3, "metrics per device")
	rate := fs.Float64("rate", 1, "samples per device per second (each sample is one reading per metric)")
	qos := fs.Int("qos", 1, "MQTT QoS: 0, 1 or 2")
	form := fs.String("form", "bare", "payload form: bare, v+t, object, senml or mixed")
	duration := fs.Duration("duration", 30*time.Second, "how long to run")
	user := fs.String("user", "", "username for every device (empty: anonymous)")
	pass := fs.String("password", "", "password for every device")
	watch := fs.Int("watch-pid", 0, "sample this process's memory (Linux /proc)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *devices < 1 || *metrics < 1 || *rate <= 0 || *qos < 0 || *qos > 2 {
		return errors.New("need --devices >= 1, --metrics >= 1, --rate > 0, --qos 0..2")
	}
	forms := map[string]firmwaresim.Form{"bare": firmwaresim.FormBare, "v+t": firmwaresim.FormVT, "object": firmwaresim.FormObject, "senml": firmwaresim.FormSenML}
	f := &firmwaresim.Fleet{Addr: *addr}
	for i := range *devices {
		d := firmwaresim.Device{
			ID: fmt.Sprintf("sim-%05d", i+1), Username: *user, Password: *pass,
			Interval: time.Duration(float64(time.Second) / *rate), QoS: byte(*qos),
		}
		if *form == "mixed" {
			d.Form = firmwaresim.Form(i % 4)
		} else if fm, ok := forms[*form]; ok {
			d.Form = fm
		} else {
			return fmt.Errorf("--form %q: use bare, v+t, object, senml or mixed", *form)
		}
		env := firmwaresim.Environmental()
		for m := range *metrics {
			mt := env[m%len(env)]
			if m >= len(env) {
				mt.Name = mt.Name + "_" + strconv.Itoa(m/len(env))
			}
			d.Metrics = append(d.Metrics, mt)
		}
		f.Devices = append(f.Devices, d)
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	done := make(chan struct{})
	go func() { f.Run(runCtx); close(done) }()

	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last firmwaresim.FleetStats
	var peakRSS, hwm uint64
	for {
		select {
		case <-done:
			st := f.Stats()
			el := time.Since(start).Seconds()
			fmt.Fprintf(out, "\n%-22s %12s\n", "", "total")
			fmt.Fprintf(out, "%-22s %12.1f\n", "seconds", el)
			fmt.Fprintf(out, "%-22s %12d\n", "devices", *devices)
			fmt.Fprintf(out, "%-22s %12d\n", "readings sent", st.Sent)
			fmt.Fprintf(out, "%-22s %12.0f\n", "readings sent/s", float64(st.Sent)/el)
			fmt.Fprintf(out, "%-22s %12d\n", "readings acked", st.Acked)
			if st.Acked > 0 {
				fmt.Fprintf(out, "%-22s %12.1f\n", "PUBACK p50 ms", float64(f.AckLatency(0.5))/1e6)
				fmt.Fprintf(out, "%-22s %12.1f\n", "PUBACK p99 ms", float64(f.AckLatency(0.99))/1e6)
			}
			fmt.Fprintf(out, "%-22s %12d\n", "errors", st.Errors)
			fmt.Fprintf(out, "%-22s %12d\n", "connections", st.Connects)
			if *watch != 0 {
				if _, h, err := procMem(*watch); err == nil {
					hwm = h
				}
				fmt.Fprintf(out, "%-22s %12.1f\n", "watched RSS peak MiB", float64(max(peakRSS, hwm))/1024)
			}
			return nil
		case <-tick.C:
			st := f.Stats()
			line := fmt.Sprintf("t=%3.0fs sent %8d (%6d/s) acked %8d (%6d/s) errors %d connections %d",
				time.Since(start).Seconds(), st.Sent, st.Sent-last.Sent, st.Acked, st.Acked-last.Acked, st.Errors, st.Connects)
			if *watch != 0 {
				if rss, h, err := procMem(*watch); err == nil {
					peakRSS, hwm = max(peakRSS, rss), h
					line += fmt.Sprintf(" | pid %d rss %.1f MiB peak %.1f MiB", *watch, float64(rss)/1024, float64(h)/1024)
				}
			}
			fmt.Fprintln(out, line)
			last = st
		}
	}
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
