package main

import (
	"context"
	"crypto/tls"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/broker"
	"github.com/edgegate/edgegate/gateway/clock"
	"periph.io/x/conn/v3/i2c/i2creg"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flagSet("run", stderr)
	path := fs.String("config", "", "config file (YAML)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	// The data directory is locked before the gateway id is settled: the
	// id may be stored there.
	lock, err := gateway.LockDataDir(cfg.Gateway.DataDir)
	if err != nil {
		return err
	}
	id, err := cfg.ResolveGatewayID()
	if err != nil {
		lock.Close()
		return err
	}
	log.Info("edgegate starting", "version", version, "gateway", cfg.Gateway.ID, "gateway_id_from", id.From, "mqtt", cfg.MQTT.Listen,
		"kafka", cfg.Kafka.Brokers, "window", cfg.Aggregate.Window.D().String())
	switch {
	case id.Was != "":
		log.Warn("gateway.id changed: this data directory was used as another gateway; what it queued before keeps the old id, and Kafka's position under the old id is not carried over",
			"gateway", id.ID, "was", id.Was, "file", id.File)
	case id.From == "generated":
		log.Info("gateway.id is not set: made one for this gateway, kept in its data directory", "gateway", id.ID, "file", id.File)
	}
	for _, w := range cfg.Warnings() {
		log.Warn("insecure configuration: " + w)
	}
	ko, err := kafkaOptions(cfg, cfg.Kafka.ClientID)
	if err != nil {
		lock.Close()
		return err
	}
	ko.Logger = log.With("component", "kafka")
	p, err := newLockedPipeline(cfg, log, lock, ko, time.Now)
	if err != nil {
		return err
	}
	// SIGHUP (systemctl reload) rereads the users file and the TLS
	// certificates.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rctx, rcancel := context.WithCancel(ctx)
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for {
			select {
			case <-rctx.Done():
				return
			case <-hup:
				if err := p.gw.Reload(); err != nil {
					log.Error("reload failed; keeping the users and certificates loaded before", "err", err)
				}
			}
		}
	}()
	err = p.run(ctx)
	rcancel()
	<-reloaded
	log.Info("edgegate stopped", "err", err)
	return err
}

// kafkaProber probes the link as `edgegate check --kafka` does.
func kafkaProber(ko kafka.Options) bridge.Prober {
	return func(ctx context.Context) (string, error) {
		r := kafka.Probe(ctx, ko)
		return r.Line(), r.Err()
	}
}

// kafkaOptions derives the producer's options from the configuration,
// reading the TLS files and the SASL password.
func kafkaOptions(cfg *configs.Config, clientID string) (kafka.Options, error) {
	o := kafka.Options{Brokers: cfg.Kafka.Brokers, ClientID: clientID, MaxRecordBytes: int(cfg.Kafka.MaxRecordBytes),
		StallTimeout: cfg.Kafka.StallTimeout.D(), DataTopics: []string{cfg.Kafka.SummariesTopic, cfg.Kafka.DeadletterTopic}}
	if cfg.Kafka.ExactlyOnce {
		o.TransactionalID = cfg.TransactionalID()
		o.OffsetsTopic = cfg.Kafka.OffsetsTopic
		o.PositionKey = cfg.Gateway.ID
	}
	var err error
	if o.TLS, err = kafkaTLS(cfg.Kafka.TLS); err != nil {
		return o, err
	}
	if m := cfg.Kafka.SASL.Mechanism; m != "" {
		pw, err := cfg.Kafka.SASL.Password()
		if err != nil {
			return o, err
		}
		o.SASL = &kafka.SASL{Mechanism: m, User: cfg.Kafka.SASL.Username, Password: pw}
	}
	return o, nil
}

func newLogger(cfg *configs.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated by configs
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// pipeline is the gateway, its forwarder and the HTTP endpoint.
type pipeline struct {
	cfg     *configs.Config
	log     *slog.Logger
	gw      *gateway.Gateway
	fwd     *bridge.Forwarder
	http    net.Listener
	lock    io.Closer // held while the pipeline runs: one gateway per data_dir
	started time.Time
	hist    *history // sampled by run every historyStep
}

// statusPage is served at /: one self-contained page that refreshes itself.
//
//go:embed status.html
var statusPage []byte

// storageWritable checks that the data directory takes a new file (a full
// disk or a read-only remount fails it).
func storageWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".readyz-*")
	if err != nil {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	_, err = f.Write([]byte{1})
	f.Close()
	os.Remove(f.Name())
	if err != nil {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	return nil
}

// newPipeline locks the data directory and makes the pipeline;
// cfg.Gateway.ID must be set.
func newPipeline(cfg *configs.Config, log *slog.Logger, ko kafka.Options, now func() time.Time) (*pipeline, error) {
	lock, err := gateway.LockDataDir(cfg.Gateway.DataDir)
	if err != nil {
		return nil, err
	}
	return newLockedPipeline(cfg, log, lock, ko, now)
}

// newLockedPipeline makes the pipeline on a locked data directory; the
// pipeline releases the lock (lock is closed if it fails). The forwarder
// delivers through a producer made with ko, and probes the link with the
// same options (see kafka.Probe).
func newLockedPipeline(cfg *configs.Config, log *slog.Logger, lock io.Closer, ko kafka.Options, now func() time.Time) (*pipeline, error) {
	policy := bridge.Backpressure
	if cfg.Storage.FullPolicy == "drop_oldest" {
		policy = bridge.DropOldest
	}
	fwd, err := bridge.NewForwarder(bridge.Options{
		Gateway:         cfg.Gateway.ID,
		SummariesTopic:  cfg.Kafka.SummariesTopic,
		DeadletterTopic: cfg.Kafka.DeadletterTopic,
		Dir:             filepath.Join(cfg.Gateway.DataDir, "outbound"),
		MaxBytes:        int64(cfg.Storage.MaxBytes),
		Policy:          policy,
		MaxRecordBytes:  int(cfg.Kafka.MaxRecordBytes),
		RefusedMaxBytes: int64(cfg.Kafka.RefusedMaxBytes),
		MaxBatchBytes:   int(cfg.Kafka.MaxBatchBytes),
		DeadLetterShare: cfg.Storage.DeadLetterShare,
		Probe:           kafkaProber(ko),
		Logger:          log.With("component", "bridge"),
	}, kafka.NewConnector(ko))
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("gateway.data_dir: %w", err)
	}
	prepareSensors(cfg, log)
	o := cfg.GatewayOptions(i2creg.Open)
	o.Clock = systemClock(cfg)
	gw, err := gateway.New(o, output.Forwarder(fwd), log, nil)
	if err != nil {
		lock.Close()
		return nil, err
	}
	p := &pipeline{cfg: cfg, log: log, gw: gw, fwd: fwd, lock: lock, started: now().UTC(), hist: newHistory()}
	if cfg.HTTP.Listen != "" {
		if p.http, err = net.Listen("tcp", cfg.HTTP.Listen); err != nil {
			return nil, fmt.Errorf("http.listen %s: %w", cfg.HTTP.Listen, err)
		}
	}
	return p, nil
}

// systemClock is the machine's clock, taken as synchronized with
// clock.synchronized: always.
func systemClock(cfg *configs.Config) clock.Clock {
	c := clock.System()
	if cfg.Clock.Synchronized == "always" {
		return clock.Assumed(c)
	}
	return c
}

// run runs until ctx is cancelled. Shutdown follows the data: the gateway
// stops accepting and closes its open windows, then the forwarder gets its
// grace period to deliver them, then the HTTP endpoint stops.
func (p *pipeline) run(ctx context.Context) error {
	defer p.lock.Close() // releases the data_dir lock
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	fwdDone := make(chan error, 1)
	go func() { fwdDone <- p.fwd.Run(fctx) }()

	var srv *http.Server
	httpDone := make(chan error, 1)
	if p.http != nil {
		srv = &http.Server{Handler: p.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { httpDone <- srv.Serve(p.http) }()
		p.log.Info("http endpoint listening", "addr", p.http.Addr().String())
	}

	// A failed outbound queue (disk error) stops the gateway: nothing more
	// may be acknowledged. So does delivery stopped for good (another
	// gateway with this gateway's id: fenced, or Kafka's position is not
	// this queue's).
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	gwDone := make(chan error, 1)
	go func() { gwDone <- p.gw.Run(gctx) }()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		p.sampleHistory(gctx)
	}()
	defer func() { gcancel(); <-sampled }()
	var gwErr, fwdErr error
	select {
	case gwErr = <-gwDone: // shutdown: the gateway has closed its windows
		fcancel()
		fwdErr = <-fwdDone
	case fwdErr = <-fwdDone:
		p.log.Error("delivery stopped for good; stopping", "err", fwdErr)
		gcancel()
		gwErr = <-gwDone
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		srv.Shutdown(sctx)
		cancel()
		if err := <-httpDone; !errors.Is(err, http.ErrServerClosed) {
			p.log.Warn("http endpoint", "err", err)
		}
	}
	return errors.Join(gwErr, fwdErr)
}

// status is one snapshot of the gateway: /api/status as JSON, and what
// /metrics, the status page and `edgegate status` show.
type status struct {
	Gateway string        `json:"gateway"`
	Version string        `json:"version"`
	Started time.Time     `json:"started"`
	MQTT    gateway.Stats `json:"mqtt"`
	Kafka   bridge.Stats  `json:"kafka"`
	Now     time.Time     `json:"now"`
	Figures figures       `json:"figures"`
	// mono is Now with the monotonic clock's reading (Now, in UTC, has
	// none): the figures and the history take time differences by it, so
	// that a step of the wall clock (NTP's first answer on a Pi without
	// a real-time clock) does not bend them.
	mono time.Time
}

// clock is when st was taken, on the monotonic clock where it was read.
func (st status) clock() time.Time {
	if st.mono.IsZero() {
		return st.Now
	}
	return st.mono
}

// counters takes the gateway's and the forwarder's counters, without the
// figures.
func (p *pipeline) counters() status {
	now := time.Now()
	return status{Gateway: p.cfg.Gateway.ID, Version: version, Started: p.started, MQTT: p.gw.Stats(), Kafka: p.fwd.Stats(), Now: now.UTC(), mono: now}
}

// status takes a snapshot and works out its figures.
func (p *pipeline) status() status {
	st := p.counters()
	st.Figures = computeFigures(st, p.hist)
	return st
}

// sampleHistory adds the counters to the history at start and every historyStep
// until ctx ends.
func (p *pipeline) sampleHistory(ctx context.Context) {
	p.hist.add(p.counters())
	t := time.NewTicker(historyStep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.hist.add(p.counters())
		}
	}
}

// listenersReady reports whether every MQTT listener accepts, and if not
// why.
func listenersReady(ls []broker.ListenerStatus) (string, bool) {
	var down []string
	for _, l := range ls {
		if !l.Accepting {
			down = append(down, fmt.Sprintf("%s listener %s not accepting for %s: %s", l.ID, l.Address, l.FailingFor.Round(time.Second), l.LastError))
		}
	}
	if len(down) > 0 {
		return strings.Join(down, "; "), false
	}
	return "accepting", true
}

// handler serves /healthz (the process is alive), /readyz (the broker's
// listeners accept and the data directory takes a file; says whether
// Kafka is reachable without failing readiness),
// /api/status (counters as JSON), /metrics (Prometheus) and / (a status
// page that refreshes itself from /api/status; no external assets).
func (p *pipeline) handler() http.Handler {
	mux := http.NewServeMux()
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		k := p.fwd.Stats()
		body := map[string]any{"ready": true, "mqtt": p.gw.Addr(), "kafka_link_up": k.LinkUp, "kafka_link": k.Link}
		code := http.StatusOK
		why, ok := listenersReady(p.gw.Listeners())
		body["mqtt_listeners"] = why
		if !ok {
			body["ready"], code = false, http.StatusServiceUnavailable
		}
		body["storage"] = "writable"
		if err := storageWritable(p.cfg.Gateway.DataDir); err != nil {
			body["ready"], body["storage"], code = false, err.Error(), http.StatusServiceUnavailable
		}
		writeJSON(w, code, body)
	})
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.status())
	})
	mux.HandleFunc("GET /api/history", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.hist.view(time.Now()))
	})
	mux.Handle("GET /metrics", p.metricsHandler())
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		w.Write(statusPage)
	})
	if p.cfg.HTTP.Pprof {
		mux.Handle("GET /debug/pprof/", pprofHandler())
	}
	return mux
}

// kafkaTLS builds the TLS configuration to the brokers, or nil when TLS
// is off.
func kafkaTLS(c configs.KafkaTLS) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	return kafka.NewTLSConfig(kafka.TLSFiles{CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, ServerName: c.ServerName})
}
