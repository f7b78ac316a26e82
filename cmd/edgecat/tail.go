package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"strconv"
	"time"

	"github.com/edgegate/edgegate/bridge/summary"
)

// errEnough stops reading once tail has printed --max summaries.
var errEnough = errors.New("enough")

func cmdTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("edgecat tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var k kafkaFlags
	k.register(fs)
	from := fs.String("from", "latest", "where to start: beginning, latest, or an RFC 3339 time (records from then on)")
	gateway := fs.String("gateway", "*", "only this gateway (a glob: gw-*)")
	device := fs.String("device", "*", "only this device (a glob)")
	metric := fs.String("metric", "*", "only this metric (a glob)")
	asJSON := fs.Bool("json", false, "print each summary as one JSON object per line, for piping")
	maxN := fs.Int("max", 0, "stop after this many summaries (0: run until interrupted)")
	toEnd := fs.Bool("to-end", false, "stop at the end of the topic instead of waiting for more")
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, g := range []string{*gateway, *device, *metric} {
		if _, err := path.Match(g, ""); err != nil {
			return usageError{fmt.Errorf("bad glob %q: %w", g, err)}
		}
	}
	n := 0
	if !*asJSON {
		fmt.Fprintf(stdout, "%-8s %-14s %-16s %-12s %-20s %6s %10s %10s %10s %10s %-5s %4s\n",
			"received", "gateway", "device", "metric", "window", "count", "min", "mean", "max", "last", "unit", "rev")
	}
	err := read(ctx, &k, readOptions{from: *from, toEnd: *toEnd, idle: 2 * time.Second}, func(r record) error {
		if r.Err != nil {
			fmt.Fprintf(stderr, "edgecat: %s/%d@%d: not a valid summary: %v\n", k.topic, r.Partition, r.Offset, r.Err)
			return nil
		}
		s := r.Summary
		if ok, _ := path.Match(*gateway, s.Gateway); !ok {
			return nil
		}
		if ok, _ := path.Match(*device, s.Device); !ok {
			return nil
		}
		if ok, _ := path.Match(*metric, s.Metric); !ok {
			return nil
		}
		if *asJSON {
			stdout.Write(append(summary.AppendJSON(nil, &s), '\n'))
		} else {
			rev := strconv.Itoa(s.Revision)
			if s.Late > 0 {
				rev += "L"
			}
			fmt.Fprintf(stdout, "%-8s %-14.14s %-16.16s %-12.12s %-20s %6d %10.4g %10.4g %10.4g %10.4g %-5.5s %4s\n",
				r.Time.Local().Format("15:04:05"), s.Gateway, s.Device, s.Metric, s.WindowStart.UTC().Format("2006-01-02T15:04:05Z"),
				s.Count, s.Min, s.Mean, s.Max, s.Last, s.Unit, rev)
		}
		if n++; *maxN > 0 && n >= *maxN {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		return nil
	}
	return err
}
