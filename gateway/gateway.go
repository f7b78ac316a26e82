// Package gateway runs the embedded MQTT broker (mochi-mqtt) and the ingest
// path: every publication on a configured topic is decoded into readings in
// the publisher's own goroutine, before the broker acknowledges it, and
// folded into the aggregator; summaries and dead letters go to an Output.
//
// Readings are taken in mochi's OnPublish hook, which runs before the
// PUBACK/PUBREC is written, so that a later durability layer can make the
// acknowledgement wait for a disk sync. Inline subscriptions are not used:
// they run after the acknowledgement and may run concurrently.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/payload"
)

// Output receives what the gateway produces. Calls are made with the
// aggregator's lock held and must not block: hand off or buffer.
type Output interface {
	Summary(aggregate.Summary)
	DeadLetter(bridge.DeadLetter)
	// Full reports that the output is over its quota: QoS 1/2 readings are
	// then refused so that devices keep them.
	Full() bool
}

// Gateway is the broker plus the ingest path. Create it with New, start it
// with Run.
type Gateway struct {
	cfg    *configs.Config
	log    *slog.Logger
	now    func() time.Time
	out    Output
	server *mqtt.Server
	addr   string
	dec    *payload.Decoder

	mu  sync.Mutex // serialises the aggregator and ing
	agg *aggregate.Aggregator
	ing ingestHandler

	rejected   [numReasons]atomic.Uint64 // payloads or items refused by the decoder, by reason
	publishes  atomic.Uint64             // publications on reading topics
	refused    atomic.Uint64             // QoS 1/2 publications refused because the output was full
	logLimiter rateLimiter
}

// New creates the broker, binds its listener and prepares the aggregator.
// now is the clock (time.Now in production). Nothing runs until Run.
func New(cfg *configs.Config, out Output, log *slog.Logger, now func() time.Time) (*Gateway, error) {
	if now == nil {
		now = time.Now
	}
	dec, err := payload.NewDecoder(cfg.MQTT.Topics, cfg.MQTT.MaxPayload)
	if err != nil {
		return nil, fmt.Errorf("mqtt.topics: %w", err)
	}
	g := &Gateway{cfg: cfg, log: log, now: now, out: out, dec: dec}
	g.logLimiter.every = 10 * time.Second
	g.ing.g = g
	g.agg, err = aggregate.New(cfg.AggregateConfig(), now, out.Summary)
	if err != nil {
		return nil, fmt.Errorf("aggregate: %w", err)
	}
	users := Users{}
	if cfg.MQTT.UsersFile != "" {
		if users, err = LoadUsers(cfg.MQTT.UsersFile); err != nil {
			return nil, fmt.Errorf("mqtt.users_file: %w", err)
		}
	}

	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(cfg.MQTT.ClientWriteQueue)
	caps.MaximumPacketSize = uint32(cfg.MQTT.MaxPacket)
	caps.ReceiveMaximum = uint16(cfg.MQTT.ReceiveMaximum)
	caps.MaximumSessionExpiryInterval = 7 * 24 * 3600 // a week; unbounded sessions would pin memory
	caps.MaximumMessageExpiryInterval = 24 * 3600
	g.server = mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  cfg.MQTT.ClientReadBuffer,
		ClientNetWriteBufferSize: cfg.MQTT.ClientWriteBuffer,
		Logger:                   log.With("component", "mqtt"),
		SysTopicResendInterval:   30,
	})
	h := &hook{g: g, auth: newAuthenticator(users, cfg.MQTT.AllowAnonymous)}
	if err := g.server.AddHook(h, nil); err != nil {
		return nil, fmt.Errorf("add mqtt hook: %w", err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: cfg.MQTT.Listen})
	if err := g.server.AddListener(tcp); err != nil {
		return nil, fmt.Errorf("mqtt.listen %s: %w", cfg.MQTT.Listen, err)
	}
	g.addr = tcp.Address()
	return g, nil
}

// Addr returns the address the MQTT listener is bound to.
func (g *Gateway) Addr() string { return g.addr }

// Run serves MQTT until ctx is cancelled. Shutdown follows the data: stop
// accepting and disconnect clients, then close every open window so its
// summary reaches the Output. It returns after the broker's goroutines and
// its own have stopped.
func (g *Gateway) Run(ctx context.Context) error {
	if err := g.server.Serve(); err != nil {
		return fmt.Errorf("start mqtt broker: %w", err)
	}
	g.log.Info("mqtt broker listening", "addr", g.addr, "anonymous", g.cfg.MQTT.AllowAnonymous, "topics", g.cfg.MQTT.Topics)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			g.mu.Lock()
			g.agg.Tick()
			g.mu.Unlock()
		case <-ctx.Done():
			g.server.Close()
			g.mu.Lock()
			open := g.agg.OpenWindows()
			g.agg.Flush()
			g.mu.Unlock()
			g.log.Info("mqtt broker stopped; open windows closed", "windows", open)
			return nil
		}
	}
}

// Stats is a snapshot of the gateway's counters.
type Stats struct {
	Clients     int64
	Publishes   uint64                    // publications on reading topics
	Refused     uint64                    // QoS 1/2 publications refused at the storage quota
	Outcomes    map[string]uint64         // readings by aggregate outcome
	Rejected    map[payload.Reason]uint64 // payloads or items refused by the decoder
	Summaries   uint64                    // summaries emitted, revisions included
	OpenWindows int
	Retained    int
	Devices     int
}

// Stats returns a snapshot of the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	c := g.agg.Counts()
	s := Stats{
		OpenWindows: g.agg.OpenWindows(),
		Retained:    g.agg.Retained(),
		Devices:     g.agg.Devices(),
		Summaries:   c.Summaries,
	}
	g.mu.Unlock()
	s.Clients = atomic.LoadInt64(&g.server.Info.ClientsConnected)
	s.Publishes = g.publishes.Load()
	s.Refused = g.refused.Load()
	s.Outcomes = map[string]uint64{}
	for o := aggregate.Aggregated; o <= aggregate.Invalid; o++ {
		s.Outcomes[o.String()] = c.Of(o)
	}
	s.Rejected = map[payload.Reason]uint64{}
	for i, r := range allReasons {
		if n := g.rejected[i].Load(); n > 0 {
			s.Rejected[r] = n
		}
	}
	return s
}

// rateLimiter lets one log line per key through per interval and counts
// the ones it held back, so a flood of bad payloads cannot flood the log.
type rateLimiter struct {
	mu    sync.Mutex
	every time.Duration
	last  map[string]time.Time
	held  map[string]int
}

// allow reports whether to log now, and how many were suppressed since the
// last line for key.
func (r *rateLimiter) allow(key string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last, r.held = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := r.last[key]; ok && now.Sub(t) < r.every {
		r.held[key]++
		return false, 0
	}
	if len(r.last) > 1000 { // keys are reasons; bound it anyway
		clear(r.last)
	}
	n := r.held[key]
	r.last[key] = now
	delete(r.held, key)
	return true, n
}
