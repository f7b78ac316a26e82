package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

func cmdLag(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("edgecat lag", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var k kafkaFlags
	k.register(fs)
	group := fs.String("group", "", "consumer group (required)")
	tail := fs.Int64("tail", 500, "records read from the end of each partition to find each gateway's newest window")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *group == "" {
		return usageError{fmt.Errorf("lag: --group is required")}
	}
	client, err := sarama.NewClient(k.brokerList(), k.config())
	if err != nil {
		return fmt.Errorf("connect to kafka %s: %w", k.brokers, err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return err
	}
	parts, err := client.Partitions(k.topic)
	if err != nil {
		return fmt.Errorf("topic %s: %w", k.topic, err)
	}
	committed, err := admin.ListConsumerGroupOffsets(*group, map[string][]int32{k.topic: parts})
	if err != nil {
		return fmt.Errorf("offsets of group %s: %w", *group, err)
	}
	fmt.Fprintf(stdout, "group %s, topic %s\n%9s %12s %12s %10s\n", *group, k.topic, "partition", "committed", "end", "lag")
	var total int64
	starts := map[int32]int64{}
	for _, p := range parts {
		end, err := client.GetOffset(k.topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("end offset of %s/%d: %w", k.topic, p, err)
		}
		first, err := client.GetOffset(k.topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("first offset of %s/%d: %w", k.topic, p, err)
		}
		starts[p] = max(first, end-*tail)
		c := int64(-1)
		if b := committed.GetBlock(k.topic, p); b != nil {
			c = b.Offset
		}
		lag := end - max(c, first) // nothing committed: all that is there
		total += lag
		cs := fmt.Sprint(c)
		if c < 0 {
			cs = "none"
		}
		fmt.Fprintf(stdout, "%9d %12s %12d %10d\n", p, cs, end, lag)
	}
	fmt.Fprintf(stdout, "%9s %12s %12s %10d\n\n", "total", "", "", total)

	// Freshness: the newest window seen from each gateway near the end.
	newest := map[string]time.Time{}
	seen := map[string]time.Time{}
	err = readFrom(ctx, &k, client, starts, func(r record) error {
		if r.Err != nil {
			return nil
		}
		if r.WindowEnd.After(newest[r.Gateway]) {
			newest[r.Gateway] = r.WindowEnd
		}
		if r.Time.After(seen[r.Gateway]) {
			seen[r.Gateway] = r.Time
		}
		return nil
	})
	if err != nil {
		return err
	}
	now := time.Now()
	fmt.Fprintf(stdout, "%-20s %-22s %12s %12s\n", "gateway", "newest window end", "window age", "record age")
	for _, gw := range slices.Sorted(func(yield func(string) bool) {
		for gw := range newest {
			if !yield(gw) {
				return
			}
		}
	}) {
		fmt.Fprintf(stdout, "%-20s %-22s %12s %12s\n", gw, newest[gw].UTC().Format(time.RFC3339),
			now.Sub(newest[gw]).Round(time.Second), now.Sub(seen[gw]).Round(time.Second))
	}
	if len(newest) == 0 {
		fmt.Fprintln(stdout, "(no summaries near the end of the topic)")
	}
	return nil
}
