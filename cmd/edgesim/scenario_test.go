package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
	"github.com/edgegate/edgegate/gateway"
)

// speed compresses the scenarios' time in the end-to-end test: the
// gateway's window settings are divided alike.
const speed = 12

// TestScenariosAgainstGateway runs the offline-replay, late-and-skewed,
// sparkplug and clocks scenarios (12 times faster) against a real gateway delivering to kfake,
// writes the truth log to a file, and requires `edgesim verify` to find
// every window exact.
func TestScenariosAgainstGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four scenarios for 15 to 20 s each")
	}
	for _, name := range []string{"offline-replay", "late-and-skewed", "sparkplug", "clocks"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runScenario(t, name)
		})
	}
}

func runScenario(t *testing.T, name string) {
	sc, err := firmwaresim.LoadScenario(filepath.Join("..", "..", "configs", "sim", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sc.Scale(speed)
	_, brokers := kafkatest.Start(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")
	cfg := configs.Default()
	cfg.Gateway.ID, cfg.Gateway.DataDir = "gw-"+name, t.TempDir()
	cfg.MQTT.Listen, cfg.MQTT.AllowAnonymous = "127.0.0.1:0", true
	cfg.HTTP.Listen = ""
	cfg.Kafka.Brokers = brokers
	rules := firmwaresim.DefaultRules()
	for _, d := range []*time.Duration{&rules.Window, &rules.MaxOutOfOrder, &rules.MaxFutureSkew} {
		*d /= speed
	}
	cfg.Aggregate.Window = configs.Duration(rules.Window)
	cfg.Aggregate.MaxOutOfOrder = configs.Duration(rules.MaxOutOfOrder)
	cfg.Aggregate.MaxFutureSkew = configs.Duration(rules.MaxFutureSkew)
	cfg.Aggregate.IdleClose = configs.Duration(cfg.Aggregate.IdleClose.D() / speed)
	cfg.Sparkplug.Enabled = true
	cfg.Sparkplug.RebirthInterval = configs.Duration(time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, fwd, stopGateway := startStack(t, &cfg)
	defer stopGateway()

	truthPath := filepath.Join(t.TempDir(), "truth.jsonl")
	var out bytes.Buffer
	if status := runMain(context.Background(), []string{"run", "--scenario", filepath.Join("..", "..", "configs", "sim", name+".yaml"),
		"--speed", fmt.Sprint(speed), "--addr", gw.Addr(), "--truth", truthPath}, &out, &out); status != 0 {
		t.Fatalf("edgesim run: status %d\n%s", status, out.String())
	}
	t.Logf("edgesim run:\n%s", lastLines(out.String(), 14))
	// Stopping the gateway closes every open window; then the forwarder
	// delivers what is queued.
	stopGateway()
	for deadline := time.Now().Add(30 * time.Second); fwd.Stats().Queued > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("forwarder still has %d records queued", fwd.Stats().Queued)
		}
	}
	st := gw.Stats()
	if st.Outcomes["late_revised"] == 0 && name == "late-and-skewed" {
		t.Error("no late revisions: the scenario did not exercise them")
	}
	if sp := st.Sparkplug; name == "sparkplug" && (sp.Historical == 0 || sp.RebirthRequests == 0 || sp.UnknownAliases == 0 || sp.SessionsEnded == 0 || sp.SeqGaps != 0) {
		t.Errorf("the scenario did not exercise historical data, rebirths and deaths (or had seq gaps): %+v", *sp)
	}
	if name == "clocks" && (st.Outcomes["future"] == 0 || st.Outcomes["device_clock_unset"] != 0) {
		t.Errorf("outcomes %v: want the clocks 2 h ahead refused as future, the 1970 ones stamped on arrival", st.Outcomes)
	}
	out.Reset()
	// Everything is in Kafka by now; verify stops reading after --idle
	// without a record, counted from before its consumer has fetched
	// anything, so the idle time is what a loaded machine may take to
	// start reading, not how long delivery takes.
	status := runMain(context.Background(), []string{"verify", "--truth", truthPath, "--brokers", strings.Join(brokers, ","),
		"--window", rules.Window.String(), "--max-out-of-order", rules.MaxOutOfOrder.String(), "--max-future-skew", rules.MaxFutureSkew.String(),
		"--idle", "5s"}, &out, &out)
	t.Logf("edgesim verify:\n%s", out.String())
	if status != 0 {
		t.Errorf("verify: status %d", status)
	}
	truth, err := os.ReadFile(truthPath)
	if err != nil || bytes.Count(truth, []byte("\n")) < 500 {
		t.Errorf("truth log: %d lines (%v)", bytes.Count(truth, []byte("\n")), err)
	}
	t.Logf("gateway: %v aggregated, %v late revisions", st.Outcomes["aggregated"], st.Outcomes["late_revised"])
}

// startStack runs a gateway and its forwarder, as cmd/edgegate composes
// them, on cfg (validated) against the brokers cfg names. stopGateway
// stops the gateway (which closes its open windows), leaving the forwarder
// to deliver; the test's end stops both.
func startStack(t *testing.T, cfg *configs.Config) (gw *gateway.Gateway, fwd *bridge.Forwarder, stopGateway func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fwd, err := bridge.NewForwarder(bridge.Options{Gateway: cfg.Gateway.ID, SummariesTopic: cfg.Kafka.SummariesTopic,
		DeadletterTopic: cfg.Kafka.DeadletterTopic, Logger: log, Dir: t.TempDir()},
		kafka.NewConnector(kafka.Options{Brokers: cfg.Kafka.Brokers, ClientID: "sim-e2e",
			TransactionalID: cfg.TransactionalID(), OffsetsTopic: cfg.Kafka.OffsetsTopic, PositionKey: cfg.Gateway.ID}))
	if err != nil {
		t.Fatal(err)
	}
	gw, err = gateway.New(cfg.GatewayOptions(nil), output.Forwarder(fwd), log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithCancel(context.Background())
	fctx, fcancel := context.WithCancel(context.Background())
	var gwg, fwg sync.WaitGroup
	gwg.Add(1)
	fwg.Add(1)
	go func() { defer gwg.Done(); gw.Run(gctx) }()
	go func() { defer fwg.Done(); fwd.Run(fctx) }()
	t.Cleanup(func() { gcancel(); gwg.Wait(); fcancel(); fwg.Wait() })
	return gw, fwd, func() { gcancel(); gwg.Wait() }
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
