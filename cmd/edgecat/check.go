package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/edgegate/edgegate/bridge/summary"
)

// series is one gateway's device's metric.
type series struct{ gateway, device, metric string }

func (s series) String() string { return s.gateway + "/" + s.device + "/" + s.metric }

// checker accumulates what check finds while reading.
type checker struct {
	records, invalid int
	ids              map[string]int
	partition        map[[2]string]int32      // gateway, device → partition
	revs             map[summary.Key][]int    // revisions read, in order
	firstEmitted     map[series]time.Time     // latest window first emitted (revision 0, no late readings)
	windows          map[series][]time.Time   // windows seen
	length           map[series]time.Duration // window length
	findings         map[string][]string      // kind → descriptions
}

func newChecker() *checker {
	return &checker{ids: map[string]int{}, partition: map[[2]string]int32{}, revs: map[summary.Key][]int{},
		firstEmitted: map[series]time.Time{}, windows: map[series][]time.Time{}, length: map[series]time.Duration{},
		findings: map[string][]string{}}
}

func (c *checker) find(kind, format string, args ...any) {
	c.findings[kind] = append(c.findings[kind], fmt.Sprintf(format, args...))
}

func (c *checker) add(r record) {
	c.records++
	if r.Err != nil {
		c.invalid++
		c.find("invalid", "partition %d offset %d: %v", r.Partition, r.Offset, r.Err)
		return
	}
	s := r.Summary
	k := summary.KeyOf(s)
	sr := series{s.Gateway, s.Device, s.Metric}
	where := fmt.Sprintf("%s@%s", sr, s.WindowStart.UTC().Format(time.RFC3339))
	if c.ids[s.ID]++; c.ids[s.ID] > 1 {
		c.find("duplicates", "%s revision %d: id %s read %d times (partition %d offset %d)", where, s.Revision, s.ID, c.ids[s.ID], r.Partition, r.Offset)
		return
	}
	dk := [2]string{s.Gateway, s.Device}
	if p, ok := c.partition[dk]; ok && p != r.Partition {
		c.find("order", "%s: device on partitions %d and %d", where, p, r.Partition)
	}
	c.partition[dk] = r.Partition
	if revs := c.revs[k]; len(revs) > 0 && s.Revision < slices.Max(revs) {
		c.find("order", "%s: revision %d read after revision %d", where, s.Revision, slices.Max(revs))
	}
	c.revs[k] = append(c.revs[k], s.Revision)
	if s.Revision == 0 && s.Late == 0 {
		if prev, ok := c.firstEmitted[sr]; ok && s.WindowStart.Before(prev) {
			c.find("order", "%s: first emitted after the window of %s", where, prev.UTC().Format(time.RFC3339))
		}
		if s.WindowStart.After(c.firstEmitted[sr]) {
			c.firstEmitted[sr] = s.WindowStart
		}
	}
	if len(c.revs[k]) == 1 {
		c.windows[sr] = append(c.windows[sr], s.WindowStart)
	}
	c.length[sr] = s.WindowEnd.Sub(s.WindowStart)
}

// finish looks for gaps and broken revision chains once everything is read.
func (c *checker) finish() (revised, longest int) {
	for _, sr := range slices.SortedFunc(func(yield func(series) bool) {
		for sr := range c.windows {
			if !yield(sr) {
				return
			}
		}
	}, func(a, b series) int { return strings.Compare(a.String(), b.String()) }) {
		ws := slices.SortedFunc(slices.Values(c.windows[sr]), time.Time.Compare)
		step := c.length[sr]
		for i := 1; i < len(ws) && step > 0; i++ {
			if missing := int(ws[i].Sub(ws[i-1])/step) - 1; missing > 0 {
				c.find("gaps", "%s: %d window(s) missing between %s and %s", sr, missing,
					ws[i-1].UTC().Format(time.RFC3339), ws[i].UTC().Format(time.RFC3339))
			}
		}
	}
	keys := slices.SortedFunc(func(yield func(summary.Key) bool) {
		for k := range c.revs {
			if !yield(k) {
				return
			}
		}
	}, func(a, b summary.Key) int {
		return cmp.Or(strings.Compare(a.Gateway, b.Gateway), strings.Compare(a.Device, b.Device), strings.Compare(a.Metric, b.Metric), a.WindowStart.Compare(b.WindowStart))
	})
	for _, k := range keys {
		revs := slices.Sorted(slices.Values(c.revs[k]))
		if revs[len(revs)-1] > 0 {
			revised++
		}
		longest = max(longest, len(revs))
		if revs[0] != 0 {
			continue // the chain began before the range read
		}
		for i, r := range revs {
			if r != i {
				c.find("revisions", "%s/%s/%s@%s: revisions %v: %d missing", k.Gateway, k.Device, k.Metric,
					k.WindowStart.Format(time.RFC3339), revs, revs[len(revs)-1]+1-len(revs))
				break
			}
		}
	}
	return revised, longest
}

var findingKinds = []string{"duplicates", "order", "gaps", "revisions", "invalid"}

func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("edgecat check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var k kafkaFlags
	k.register(fs)
	from := fs.String("from", "beginning", "start of the range: beginning, latest, or an RFC 3339 time")
	idle := fs.Duration("idle", 2*time.Second, "stop reading a partition after this long without records (transactions still open)")
	allowGaps := fs.Bool("allow-gaps", false, "report gaps without failing on them (devices that were silent)")
	show := fs.Int("show", 20, "print at most this many findings of each kind")
	if err := parse(fs, args); err != nil {
		return err
	}
	c := newChecker()
	if err := read(ctx, &k, readOptions{from: *from, toEnd: true, idle: *idle}, func(r record) error { c.add(r); return nil }); err != nil {
		return err
	}
	revised, longest := c.finish()
	fmt.Fprintf(stdout, "%s: %d records, %d windows of %d series; %d windows revised, longest revision chain %d\n",
		k.topic, c.records, len(c.revs), len(c.windows), revised, longest)
	failed := false
	for _, kind := range findingKinds {
		f := c.findings[kind]
		fmt.Fprintf(stdout, "%-10s %d\n", kind, len(f))
		for i, line := range f {
			if i == *show {
				fmt.Fprintf(stdout, "  … and %d more\n", len(f)-i)
				break
			}
			fmt.Fprintf(stdout, "  %s\n", line)
		}
		if len(f) > 0 && !(kind == "gaps" && *allowGaps) {
			failed = true
		}
	}
	if failed {
		return errFindings
	}
	fmt.Fprintln(stdout, "OK")
	return nil
}
