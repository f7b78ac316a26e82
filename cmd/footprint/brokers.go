package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafka"
)

// startWait bounds a broker's start, until it takes MQTT connections (and,
// for edgegate, is linked to Kafka).
const startWait = time.Minute

// broker is one of the brokers compared.
type broker interface {
	name() string
	// version names what runs, as the table's column header.
	version() string
	// start runs a fresh broker with its files in dir.
	start(dir string) (*server, error)
}

// server is a running broker: the measured process and, for edgegate, the
// Kafka-protocol broker it delivers to, in a process of its own.
type server struct {
	main  *proc
	addr  string // MQTT
	kafka *proc  // nil but for edgegate
	// kafkaAddr and httpAddr are edgegate's.
	kafkaAddr, httpAddr string
}

// stopped is what a server's stop reports.
type stopped struct {
	cpu       time.Duration // the measured process's, over its life
	kafkaCPU  time.Duration // devkafka's, over its life
	summaries int           // records in edge.summaries (read_committed) after edgegate's exit
}

// stop stops the broker (SIGTERM; edgegate closes its windows and
// delivers them), then counts what reached Kafka, then stops Kafka.
func (s *server) stop(ctx context.Context) (stopped, error) {
	var st stopped
	var err error
	st.cpu, err = s.main.stop()
	if s.kafka == nil || err != nil {
		s.kill()
		return st, err
	}
	st.summaries, err = countSummaries(ctx, s.kafkaAddr)
	if err != nil {
		s.kill()
		return st, err
	}
	st.kafkaCPU, err = s.kafka.stop()
	return st, err
}

// kill ends whatever still runs; for error paths.
func (s *server) kill() {
	s.main.kill()
	if s.kafka != nil {
		s.kafka.kill()
	}
}

// cpu returns the CPU time used so far by the measured process and by
// Kafka.
func (s *server) cpu() (main, kafka time.Duration, err error) {
	if main, err = cpuTime(s.main.pid()); err != nil || s.kafka == nil {
		return main, 0, err
	}
	kafka, err = cpuTime(s.kafka.pid())
	return main, kafka, err
}

type mosquitto struct{ bin string }

func (m mosquitto) name() string { return "mosquitto" }

func (m mosquitto) version() string {
	out, _ := exec.Command(m.bin, "-h").Output() // exits 3 after the usage
	first, _, _ := strings.Cut(string(out), "\n")
	if v, ok := strings.CutPrefix(first, "mosquitto version "); ok {
		return "mosquitto " + strings.TrimSpace(v) + " (no persistence)"
	}
	return "mosquitto (no persistence)"
}

func (m mosquitto) start(dir string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n", port), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc(dir, "mosquitto", m.bin, "-c", conf)
	if err != nil {
		return nil, err
	}
	s := &server{main: p, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	if err := waitListening(p, s.addr, startWait); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// mochi is a plain mochi-mqtt broker: this program's mochi subcommand.
type mochi struct{ self string }

func (m mochi) name() string { return "mochi" }

func (m mochi) version() string {
	v := "v2"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/mochi-mqtt/server/v2" {
				v = d.Version
			}
		}
	}
	return "mochi " + v + " (defaults, allow-all)"
}

func (m mochi) start(dir string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProc(dir, "mochi", m.self, "mochi", "--listen", addr)
	if err != nil {
		return nil, err
	}
	s := &server{main: p, addr: addr}
	if err := waitListening(p, addr, startWait); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// edgegate is the gateway with its default configuration (anonymous
// devices allowed, each to its own readings), delivering to devkafka.
type edgegate struct{ bin, devkafka string }

func (e edgegate) name() string { return "edgegate" }

func (e edgegate) version() string {
	out, err := exec.Command(e.bin, "version").Output()
	if err != nil {
		return "edgegate"
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "edgegate ")
	v, _, _ = strings.Cut(v, " (")
	return "edgegate " + v
}

func (e edgegate) start(dir string) (*server, error) {
	k, err := startProc(dir, "devkafka", e.devkafka, "--port", "0", "--partitions", "3")
	if err != nil {
		return nil, err
	}
	kafkaAddr, err := waitLine(k, "kafka listening on ", startWait)
	if err != nil {
		k.kill()
		return nil, err
	}
	mqttPort, err1 := freePort()
	httpPort, err2 := freePort()
	if err := errors.Join(err1, err2); err != nil {
		k.kill()
		return nil, err
	}
	s := &server{addr: fmt.Sprintf("127.0.0.1:%d", mqttPort), kafka: k, kafkaAddr: kafkaAddr, httpAddr: fmt.Sprintf("127.0.0.1:%d", httpPort)}
	// The load's readings carry no time, and a bench machine may run no
	// NTP: the gateway would hold them until its clock is synchronized.
	conf := filepath.Join(dir, "edgegate.yaml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `gateway: {id: footprint, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true}
kafka: {brokers: ["%s"]}
http: {listen: "%s"}
clock: {synchronized: always}
`, filepath.Join(dir, "data"), s.addr, kafkaAddr, s.httpAddr), 0o644); err != nil {
		k.kill()
		return nil, err
	}
	if s.main, err = startProc(dir, "edgegate", e.bin, "run", "--config", conf); err != nil {
		k.kill()
		return nil, err
	}
	if err := waitListening(s.main, s.addr, startWait); err != nil {
		s.kill()
		return nil, err
	}
	if err := waitReady(s, startWait); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// waitReady waits until edgegate's /readyz says it is ready. (Its Kafka
// link comes up when there is a first batch to deliver.)
func waitReady(s *server, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var ready struct {
			Ready bool `json:"ready"`
		}
		if resp, err := http.Get("http://" + s.httpAddr + "/readyz"); err == nil {
			json.NewDecoder(resp.Body).Decode(&ready)
			resp.Body.Close()
			if ready.Ready {
				return nil
			}
		}
		if err := s.main.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("edgegate not ready after %s (log: %s)", limit, s.main.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countSummaries reads edge.summaries to its end, read_committed.
func countSummaries(ctx context.Context, addr string) (int, error) {
	client, err := sarama.NewClient([]string{addr}, kafka.ReadConfig("footprint"))
	if err != nil {
		return 0, fmt.Errorf("count summaries in Kafka: %w", err)
	}
	defer client.Close()
	n := 0
	err = kafka.Read(ctx, client, kafka.ReadOptions{Topic: "edge.summaries", ToEnd: true, Idle: 500 * time.Millisecond},
		func(*sarama.ConsumerMessage) error { n++; return nil })
	if err != nil {
		return 0, fmt.Errorf("count summaries in Kafka: %w", err)
	}
	return n, nil
}
