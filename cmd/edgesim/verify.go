package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafka"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// verify is "edgesim verify": the truth log against the summaries topic.
func verify(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("edgesim verify", flag.ContinueOnError)
	truthPath := fs.String("truth", "", "truth log written by edgesim run --truth (required)")
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, comma-separated")
	topic := fs.String("topic", "edge.summaries", "summaries topic")
	gateway := fs.String("gateway", "", "only summaries of this gateway id (default: all)")
	devices := fs.String("devices", "*", "only summaries of devices matching this pattern (path.Match syntax, e.g. sim-*, or sim/*/* for Sparkplug devices, whose names have '/'): other devices share the gateway; the default, *, keeps every device")
	rules := firmwaresim.DefaultRules()
	fs.DurationVar(&rules.Window, "window", rules.Window, "the gateway's aggregate.window")
	fs.DurationVar(&rules.MaxOutOfOrder, "max-out-of-order", rules.MaxOutOfOrder, "the gateway's aggregate.max_out_of_order")
	fs.DurationVar(&rules.AllowedLateness, "allowed-lateness", rules.AllowedLateness, "the gateway's aggregate.allowed_lateness")
	fs.DurationVar(&rules.MaxFutureSkew, "max-future-skew", rules.MaxFutureSkew, "the gateway's aggregate.max_future_skew")
	floor := fs.String("time-floor", rules.TimeFloor.Format(time.DateOnly), "device times before this date are clocks never set (the gateway's floor is a year before its build, never before 2025-01-01)")
	fs.StringVar(&rules.UntrustedDeviceTime, "untrusted-device-time", rules.UntrustedDeviceTime, "the gateway's aggregate.untrusted_device_time: arrival or deadletter")
	idle := fs.Duration("idle", 2*time.Second, "stop reading once no record came for this long")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up reading after this long")
	all := fs.Bool("all", false, "list every device, not only those with problems")
	problems := fs.Int("problems", 50, "print at most this many problem lines")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *truthPath == "" || fs.NArg() > 0 || rules.Window <= 0 {
		return errors.New("verify: want --truth FILE (and no other arguments); --window must be positive")
	}
	var err error
	if rules.TimeFloor, err = time.Parse(time.DateOnly, *floor); err != nil {
		return fmt.Errorf("verify: --time-floor %q: want a date such as 2025-01-01", *floor)
	}
	if u := rules.UntrustedDeviceTime; u != "arrival" && u != "deadletter" {
		return fmt.Errorf("verify: --untrusted-device-time %q: use arrival or deadletter, as the gateway's aggregate.untrusted_device_time", u)
	}
	f, err := os.Open(*truthPath)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	truth, err := firmwaresim.ReadTruth(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("verify: %s: %w", *truthPath, err)
	}
	if _, err := path.Match(*devices, ""); err != nil {
		return fmt.Errorf("verify: --devices %q: %w", *devices, err)
	}
	found, err := readSummaries(ctx, strings.Split(*brokers, ","), *topic, *gateway, *idle, *timeout)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	kept := found[:0]
	for _, f := range found {
		if ok, _ := path.Match(*devices, f.Device); ok || *devices == "*" {
			kept = append(kept, f)
		}
	}
	found = kept
	fmt.Fprintf(out, "truth log %s: %d records; %s: %d summaries read (read_committed)\n", *truthPath, len(truth), *topic, len(found))
	r := firmwaresim.Verify(truth, found, rules)
	r.WriteTable(out, *all, *problems)
	if !r.OK() {
		return errMismatch
	}
	return nil
}

// readSummaries reads every committed record of topic from the beginning
// until none has come for idle, decoding each as a summary. Records of
// other gateways are skipped when gateway is set; a record that is not a
// summary is an error.
func readSummaries(ctx context.Context, brokers []string, topic, gateway string, idle, timeout time.Duration) ([]firmwaresim.Found, error) {
	client, err := sarama.NewClient(brokers, kafka.ReadConfig("edgesim-verify"))
	if err != nil {
		return nil, fmt.Errorf("connect to kafka %v: %w", brokers, err)
	}
	defer client.Close()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	quiet := time.AfterFunc(idle, cancel)
	defer quiet.Stop()
	var found []firmwaresim.Found
	err = kafka.Read(rctx, client, kafka.ReadOptions{Topic: topic}, func(m *sarama.ConsumerMessage) error {
		var f firmwaresim.Found
		if err := json.Unmarshal(m.Value, &f); err != nil || f.ID == "" {
			return fmt.Errorf("%s/%d@%d is not a summary: %q", topic, m.Partition, m.Offset, m.Value)
		}
		if gateway == "" || f.Gateway == gateway {
			f.Partition, f.Offset = m.Partition, m.Offset
			found = append(found, f)
		}
		quiet.Reset(idle)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return found, nil // what there was, until idle or in the time allowed
}
