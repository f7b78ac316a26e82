//go:build !nodemo

// The demo: kfake in process, the gateway, a simulated fleet and a
// sarama consumer printing the summaries. Release builds for ARM gateways
// leave it out (-tags nodemo, see demo_off.go): it links a second Kafka
// stack and both MQTT clients of the simulator.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/configs"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// demoHelp is the demo's line in the usage.
const demoHelp = "in-process Kafka, gateway and simulated devices"

type demoOptions struct {
	mqtt     string
	http     string
	devices  int
	window   time.Duration
	interval time.Duration
	duration time.Duration
	// malformed is the chance that a publication of the last device is a
	// payload the decoder refuses: the page's dead letters then have
	// something to show.
	malformed float64
	verbose   bool
}

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagSet("demo", stderr)
	var o demoOptions
	fs.StringVar(&o.mqtt, "mqtt", "127.0.0.1:1883", "address for the MQTT broker (127.0.0.1:0 picks a free port)")
	fs.StringVar(&o.http, "http", "127.0.0.1:8080", "address for the status page, /metrics and /api/status (127.0.0.1:0 picks a free port; empty: none)")
	fs.IntVar(&o.devices, "devices", 6, "simulated devices")
	fs.DurationVar(&o.window, "window", 10*time.Second, "aggregation window (1m in production)")
	fs.DurationVar(&o.interval, "interval", time.Second, "how often each simulated device samples")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	fs.Float64Var(&o.malformed, "malformed", 0.03, "chance that a publication of the last device is malformed (a dead letter, shown on the status page)")
	fs.BoolVar(&o.verbose, "v", false, "show the gateway's log")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.devices < 0 || o.window < time.Second || o.interval <= 0 || o.malformed < 0 || o.malformed > 1 {
		return usageError{fmt.Errorf("demo: need --devices >= 0, --window >= 1s, --interval > 0, --malformed from 0 to 1")}
	}
	return runDemo(ctx, o, stdout, stderr)
}

// runDemo starts an in-process Kafka-protocol broker, the gateway and a
// simulated fleet, and prints each summary as it arrives in Kafka.
func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	stdout = &syncWriter{w: stdout} // the viewer and this goroutine both print
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	dataDir, err := os.MkdirTemp("", "edgegate-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	cfg := configs.Default()
	cfg.Gateway.ID = "demo-gw"
	cfg.Gateway.DataDir = dataDir
	cfg.MQTT.Listen = o.mqtt
	cfg.MQTT.AllowAnonymous = true
	cfg.MQTT.ACL.AnonymousRole = "admin" // a lab: any client id may publish any device's readings, mosquitto_pub's too
	cfg.HTTP.Listen = o.http
	cfg.Aggregate.Window = configs.Duration(o.window)
	cfg.Aggregate.MaxOutOfOrder = configs.Duration(min(2*time.Second, o.window/2))
	cfg.Aggregate.IdleClose = configs.Duration(o.window + o.window/2)
	// The simulated fleet keeps this machine's time, synchronized or not:
	// nothing waits for NTP in the demo.
	cfg.Clock.Synchronized = "always"

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, cfg.Kafka.SummariesTopic, cfg.Kafka.DeadletterTopic))
	if err != nil {
		return fmt.Errorf("start in-process kafka: %w", err)
	}
	defer cluster.Close()
	if err := cluster.CreateTopic(cfg.Kafka.OffsetsTopic, 3, kafka.OffsetsTopicConfig); err != nil {
		return fmt.Errorf("start in-process kafka: %w", err)
	}
	cfg.Kafka.Brokers = cluster.ListenAddrs()
	if err := cfg.Validate(); err != nil {
		return err
	}
	logOut := io.Discard
	if o.verbose {
		logOut = stderr
	}
	log := newLogger(&cfg, logOut)
	ko, err := kafkaOptions(&cfg, "edgegate-demo")
	if err != nil {
		return err
	}
	p, err := newPipeline(&cfg, log, ko, time.Now)
	if err != nil {
		return fmt.Errorf("%w (is another MQTT broker or web server running? try --mqtt 127.0.0.1:0 --http 127.0.0.1:0)", err)
	}
	addr := p.gw.Addr()
	web := "  (none: --http is empty)\n"
	if p.http != nil {
		u := "http://" + p.http.Addr().String()
		web = fmt.Sprintf("  Status page  %s/   the operator's view; also %s/metrics and %s/api/status\n", u, u, u)
	}
	fmt.Fprintf(stdout, `edgegate demo: an in-process Kafka-protocol broker, the gateway, and %d simulated devices.
  MQTT broker  %s   publish your own: mosquitto_pub -h %s -p %s -t sensors/my-device/temp_c -m 21.5
  Kafka        %s   topics %s, %s (read with: kcat -C -b %s -t %s)
%s  Demo mode: windows are %s (1m by default) so summaries show within seconds. Ctrl-C stops.

`, o.devices, addr, host(addr), port(addr), cfg.Kafka.Brokers[0], cfg.Kafka.SummariesTopic, cfg.Kafka.DeadletterTopic,
		cfg.Kafka.Brokers[0], cfg.Kafka.SummariesTopic, web, o.window)

	var wg sync.WaitGroup
	gwCtx, gwCancel := context.WithCancel(context.Background())
	defer gwCancel()
	pipeDone := make(chan error, 1)
	go func() { pipeDone <- p.run(gwCtx) }()

	viewCtx, viewCancel := context.WithCancel(context.Background())
	defer viewCancel()
	view := &viewer{out: stdout}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := view.run(viewCtx, cfg.Kafka.Brokers, cfg.Kafka.SummariesTopic); err != nil {
			fmt.Fprintf(stderr, "edgegate demo: summary viewer: %v\n", err)
		}
	}()

	fleet := firmwaresim.NewFleet(addr, o.devices, "demo", o.interval, 1)
	if n := len(fleet.Devices); n > 0 && o.malformed > 0 {
		fleet.Devices[n-1].MalformedProb = o.malformed
		fmt.Fprintf(stdout, "  %s sends a malformed payload now and then (--malformed %g): each is a dead letter, on the page and in %s.\n\n",
			fleet.Devices[n-1].ID, o.malformed, cfg.Kafka.DeadletterTopic)
	}
	fleet.OnError = func(dev string, err error) {
		if ctx.Err() == nil {
			log.Warn("simulated device", "device", dev, "err", err)
		}
	}
	fleet.Run(ctx) // until Ctrl-C or --duration

	fmt.Fprintf(stdout, "\nstopping: closing open windows and delivering them...\n")
	gwCancel()
	err = <-pipeDone
	// Let the viewer catch up with what the shutdown delivered.
	want := p.gw.Stats().Summaries
	deadline := time.Now().Add(3 * time.Second)
	for view.records() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	viewCancel()
	wg.Wait()
	st := p.status()
	var readings, bad int
	for _, s := range fleet.Truth.Sent() {
		if s.Kind == firmwaresim.KindMalformed {
			bad++
		} else {
			readings++
		}
	}
	var dead uint64
	for _, n := range st.MQTT.DeadLetters {
		dead += n
	}
	fmt.Fprintf(stdout, "\nreadings sent %d, aggregated %d, late revisions %d; malformed payloads sent %d, dead letters %d; summaries emitted %d; records delivered to Kafka %d (summaries and dead letters)\n",
		readings, st.MQTT.Outcomes[aggregate.Aggregated.String()], st.MQTT.Outcomes[aggregate.Revised.String()],
		bad, dead, st.MQTT.Summaries, st.Kafka.Delivered)
	return err
}

// viewer prints summaries as a read_committed consumer sees them.
type viewer struct {
	out io.Writer
	mu  sync.Mutex
	n   uint64 // records seen (summaries and others)
}

func (v *viewer) records() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n
}

func (v *viewer) run(ctx context.Context, brokers []string, topic string) error {
	cfg := kafka.ReadConfig("")
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	cfg.Consumer.Return.Errors = false // the viewer keeps going while sarama retries
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	const row = "%-17s  %-10s  %-9s  %-4s  %5v  %10v  %10v  %10v  %10v  %3v\n"
	fmt.Fprintf(v.out, row, "window (UTC)", "device", "metric", "unit", "count", "min", "max", "mean", "last", "rev")
	return kafka.Read(ctx, client, kafka.ReadOptions{Topic: topic, Partitions: parts}, func(m *sarama.ConsumerMessage) error {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			fmt.Fprintf(v.out, "undecodable record: %v\n", err)
		} else {
			g := func(f float64) string { return strconv.FormatFloat(f, 'g', 7, 64) }
			fmt.Fprintf(v.out, row, s.WindowStart.UTC().Format("15:04:05")+"-"+s.WindowEnd.UTC().Format("15:04:05"),
				s.Device, s.Metric, s.Unit, s.Count, g(s.Min), g(s.Max), g(s.Mean), g(s.Last), s.Revision)
		}
		v.mu.Lock()
		v.n++
		v.mu.Unlock()
		return nil
	})
}

func host(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
