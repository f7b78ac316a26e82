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
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/queue"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/payload"
)

// Output receives what the gateway produces. Calls are made with the
// aggregator's lock held and must not block: hand off or buffer.
type Output interface {
	// Summary and DeadLetter take an output with its mark: the journal
	// event that produced it and its index among that event's outputs.
	Summary(aggregate.Summary, bridge.Mark)
	DeadLetter(bridge.DeadLetter, bridge.Mark)
	// Full reports that the output is over its quota: QoS 1/2 readings are
	// then refused so that devices keep them.
	Full() bool
	// Stored returns the mark of the last output already stored. When the
	// journal is replayed after a crash, outputs up to it are not made
	// again.
	Stored() bridge.Mark
	// Sync makes every output so far durable (before a checkpoint).
	Sync() error
}

// Gateway is the broker plus the ingest path. Create it with New, start it
// with Run.
type Gateway struct {
	cfg     *configs.Config
	log     *slog.Logger
	now     func() time.Time
	out     Output
	server  *mqtt.Server
	hook    *hook
	addr    string // the plain TCP listener's address, if any
	tlsAddr string
	wsAddr  string
	tls     *serverTLS // nil without a TLS listener
	dec     *payload.Decoder
	jlog    *queue.Log // the ingest journal, <data_dir>/ingest
	j       *journal
	state   *stateDB // checkpoint and closed windows, <data_dir>/state/state.db

	mu       sync.Mutex // serialises applying events: the aggregator, ing and what follows
	agg      *aggregate.Aggregator
	ing      ingestHandler
	clock    time.Time   // the aggregator's clock: the time of the latest event applied
	cur      bridge.Mark // the event being applied, and its outputs so far
	suppress bridge.Mark // outputs up to this mark are already stored (replay)
	applied  uint64      // journal sequence of the latest event applied
	sessions map[string]session
	awaitRel pidSets                            // QoS 2 publications received (PUBREC sent) whose PUBREL has not come
	subs     map[string]map[string]subscription // client → filter → subscription
	dup      *dedupe
	lastCP   uint64 // sequence of the latest checkpoint written

	sensors []*sensorState // the gateway's own I2C sensors

	recent     [20]RecentDeadLetter // the latest dead letters, a ring (under mu)
	recentNext int

	cpWritten atomic.Int64 // journal bytes written when the latest checkpoint was taken
	cpSize    atomic.Int64 // its size

	rejected   [numReasons]atomic.Uint64 // payloads or items refused by the decoder, by reason
	publishes  atomic.Uint64             // publications on reading topics
	refused    atomic.Uint64             // QoS 1/2 publications refused because the output was full
	duplicates atomic.Uint64             // QoS 1/2 resends of journaled publications, not counted again
	badEvents  atomic.Uint64             // journal records that could not be decoded
	suppressed atomic.Uint64             // outputs not made again during replay
	replayed   atomic.Uint64             // journal events replayed at start
	cpFailures atomic.Uint64             // checkpoints that could not be written
	logLimiter rateLimiter

	mqttRefused refusals      // clients and packets the broker turned away, by reason
	connsOpen   atomic.Int64  // sockets open, CONNECT sent or not
	throttled   atomic.Uint64 // publications held back by mqtt.publish_rate_per_client
}

// New opens the ingest journal in cfg.Gateway.DataDir, rebuilds the state
// from the latest checkpoint and the journal after it, creates the broker
// and binds its listener. now is the clock (time.Now in production).
// Nothing runs until Run.
func New(cfg *configs.Config, out Output, log *slog.Logger, now func() time.Time) (*Gateway, error) {
	if now == nil {
		now = time.Now
	}
	dec, err := payload.NewDecoder(cfg.MQTT.Topics, cfg.MQTT.MaxPayload)
	if err != nil {
		return nil, fmt.Errorf("mqtt.topics: %w", err)
	}
	g := &Gateway{cfg: cfg, log: log, now: now, out: out, dec: dec, sessions: map[string]session{}, awaitRel: pidSets{},
		subs: map[string]map[string]subscription{},
		dup:  newDedupe(cfg.MQTT.ReceiveMaximum, 100_000)}
	g.logLimiter.every = 10 * time.Second
	g.ing.g = g
	g.sensors = newSensorStates(cfg)
	g.agg, err = aggregate.New(cfg.AggregateConfig(), func() time.Time { return g.clock }, g.emitSummary)
	if err != nil {
		return nil, fmt.Errorf("aggregate: %w", err)
	}
	users, err := loadUsers(cfg)
	if err != nil {
		return nil, err
	}
	rules, err := newACL(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.MQTT.TLS.Listen != "" || cfg.MQTT.WebSocket.TLS {
		if g.tls, err = newServerTLS(cfg.MQTT.TLS); err != nil {
			return nil, err
		}
	}
	if err := g.recover(); err != nil {
		return nil, err
	}
	g.j = newJournal(g.jlog, cfg.Storage.FsyncInterval.D(), now, g.apply)

	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(cfg.MQTT.ClientWriteQueue)
	caps.MaximumPacketSize = uint32(cfg.MQTT.MaxPacket)
	caps.ReceiveMaximum = uint16(cfg.MQTT.ReceiveMaximum)
	caps.MaximumSessionExpiryInterval = uint32(cfg.MQTT.MaxSessionExpiry.D().Seconds())
	caps.MaximumMessageExpiryInterval = 24 * 3600
	caps.MaximumClients = int64(cfg.MQTT.MaxClients)
	caps.TopicAliasMaximum = uint16(cfg.MQTT.TopicAliasMaximum)
	g.server = mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  cfg.MQTT.ClientReadBuffer,
		ClientNetWriteBufferSize: cfg.MQTT.ClientWriteBuffer,
		Logger:                   slog.New(newQuietHandler(log.Handler())).With("component", "mqtt"),
		SysTopicResendInterval:   30,
		InlineClient:             true, // publishes the gateway's sensor readings to local subscribers
	})
	h := &hook{g: g, auth: newAuthenticator(users, cfg.MQTT.AllowAnonymous), acl: rules,
		conns: newConnLimiter(cfg.MQTT.ConnectRate, cfg.MQTT.ConnectBurst, cfg.MQTT.ConnectRateExempt)}
	g.hook = h
	if err := g.server.AddHook(h, nil); err != nil {
		g.closeFiles()
		return nil, fmt.Errorf("add mqtt hook: %w", err)
	}
	add := func(key string, l listeners.Listener) (string, error) {
		if err := g.server.AddListener(&guarded{Listener: l, g: g, h: h}); err != nil {
			g.closeFiles()
			return "", fmt.Errorf("%s %s: %w", key, l.Address(), err)
		}
		return l.Address(), nil
	}
	if cfg.MQTT.Listen != "" {
		if g.addr, err = add("mqtt.listen", listeners.NewTCP(listeners.Config{ID: "tcp", Address: cfg.MQTT.Listen})); err != nil {
			return nil, err
		}
	}
	if cfg.MQTT.TLS.Listen != "" {
		l := listeners.NewTCP(listeners.Config{ID: "tls", Address: cfg.MQTT.TLS.Listen, TLSConfig: g.tls.Config()})
		if g.tlsAddr, err = add("mqtt.tls.listen", l); err != nil {
			return nil, err
		}
	}
	if cfg.MQTT.WebSocket.Listen != "" {
		lc := listeners.Config{ID: "ws", Address: cfg.MQTT.WebSocket.Listen}
		if cfg.MQTT.WebSocket.TLS {
			lc.TLSConfig = g.tls.Config()
		}
		if g.wsAddr, err = add("mqtt.websocket.listen", listeners.NewWebsocket(lc)); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// recover opens the journal and the state file, loads the checkpoint and
// replays the journal after it. Outputs that the Output already stored are
// not made again, so the queue ends up as if there had been no crash.
func (g *Gateway) recover() error {
	start := time.Now()
	dir := g.cfg.Gateway.DataDir
	var err error
	// The state file first: its lock keeps a second gateway from
	// recovering (truncating) a journal that another one is writing.
	stateDir := filepath.Join(dir, "state")
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return fmt.Errorf("gateway.data_dir: %w", err)
	}
	if g.state, err = openStateDB(filepath.Join(stateDir, "state.db"), g.log); err != nil {
		return fmt.Errorf("gateway.data_dir: %w", err)
	}
	g.jlog, err = queue.Open(filepath.Join(dir, "ingest"), queue.Options{Logger: g.log.With("component", "journal")})
	if err != nil {
		g.state.Close()
		return fmt.Errorf("gateway.data_dir: open ingest journal: %w", err)
	}
	fail := func(err error) error {
		g.closeFiles()
		return err
	}
	var cp *checkpoint
	blob, err := g.state.checkpoint()
	if err != nil {
		return fail(fmt.Errorf("read checkpoint: %w", err))
	}
	if blob != nil {
		if cp, err = decodeCheckpoint(blob); err != nil {
			// The windows stored with it no longer match any state: start
			// again from what the journal holds.
			g.log.Error("checkpoint damaged; replaying the journal from its first record without the stored windows", "err", err)
			if err := g.state.clearWindows(); err != nil {
				return fail(fmt.Errorf("clear stored windows: %w", err))
			}
		}
	}
	js := g.jlog.Stats()
	from := uint64(1)
	g.suppress = g.out.Stored()
	if cp != nil {
		if js.Next <= cp.seq {
			// The journal is behind the checkpoint: it was removed or
			// replaced. Its sequence numbers start again, so marks of
			// stored outputs say nothing about the new events.
			g.log.Error("ingest journal is older than the checkpoint (was it deleted?); starting from the checkpoint's state",
				"checkpoint", cp.seq, "journal_next", js.Next)
			cp.seq = js.Next - 1
			g.suppress = bridge.Mark{}
		}
		if err := g.agg.Restore(cp.agg); err != nil {
			// Typically aggregate.window was changed: windows of the old
			// size cannot continue.
			g.log.Error("aggregator state in the checkpoint does not fit the configuration; its open and stored windows are discarded",
				"err", err)
			if err := g.state.clearWindows(); err != nil {
				return fail(fmt.Errorf("clear stored windows: %w", err))
			}
		}
		g.clock = time.Unix(0, cp.clock)
		g.sessions, g.dup.rings, g.awaitRel, g.subs = cp.sessions, cp.rings, cp.awaitRel, cp.subs
		g.applied, g.lastCP = cp.seq, cp.seq
		from = cp.seq + 1
	}
	g.agg.SetStore(g.state)
	if js.First > from {
		g.log.Error("ingest journal records missing before the replay start; their readings are lost",
			"want_from", from, "journal_first", js.First)
	}
	n, err := g.replay(from)
	if err != nil {
		return fail(err)
	}
	if n > 0 || cp != nil || js.Truncated > 0 {
		g.log.Info("state recovered", "checkpoint", g.lastCP, "replayed_events", n, "outputs_already_stored", g.suppressed.Load(),
			"journal_truncated_bytes", js.Truncated, "open_windows", g.agg.OpenWindows(), "sessions", len(g.sessions),
			"took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// closeFiles closes the journal and the state file.
func (g *Gateway) closeFiles() error {
	return errors.Join(g.jlog.Close(), g.state.Close())
}

// replay applies the durable journal records from sequence from on.
func (g *Gateway) replay(from uint64) (int, error) {
	r := g.jlog.NewReader(from)
	defer r.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for {
		seq, rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, fmt.Errorf("replay ingest journal: %w", err)
		}
		g.applyLocked(seq, append([]byte(nil), rec...))
		n++
	}
	g.replayed.Store(uint64(n))
	return n, nil
}

// apply applies a durable batch of journal records (the journal's flusher
// calls it, in journal order).
func (g *Gateway) apply(first uint64, recs [][]byte) {
	g.mu.Lock()
	for i, rec := range recs {
		g.applyLocked(first+uint64(i), rec)
	}
	g.mu.Unlock()
}

// applyLocked applies one event. Everything it does depends only on the
// event and the state, so a replay does the same. rec is not kept: names
// the aggregator keeps are copied.
func (g *Gateway) applyLocked(seq uint64, rec []byte) {
	g.applied = seq
	g.cur = bridge.Mark{Seq: seq}
	e, err := decodeEvent(rec)
	if err != nil {
		g.badEvents.Add(1)
		g.log.Error("ingest journal record undecodable; skipped", "seq", seq, "err", err)
		return
	}
	if t := time.Unix(0, e.at); t.After(g.clock) {
		g.clock = t
	}
	switch e.kind {
	case evPublish:
		if e.flags&flagQoSMask > 0 {
			h := contentHash(e.topic, e.payload)
			if e.flags&flagDup != 0 && g.dup.seen(e.client, e.pid, h) {
				g.duplicates.Add(1)
				return
			}
			g.dup.add(e.client, e.pid, h, seq)
		}
		if e.flags&flagQoSMask == 2 {
			g.awaitRel.add(string(e.client), e.pid)
		}
		g.ingestLocked(unsafe.String(unsafe.SliceData(e.topic), len(e.topic)),
			unsafe.String(unsafe.SliceData(e.client), len(e.client)), e.payload, g.clock)
	case evTick:
		g.agg.Tick()
	case evFlush:
		g.agg.Flush()
	case evSessionStart: // a clean start journals an end first
		g.sessions[string(e.client)] = e.sess
	case evSessionEnd:
		g.dup.drop(e.client)
		delete(g.sessions, string(e.client))
		delete(g.awaitRel, string(e.client))
		delete(g.subs, string(e.client))
	case evPubrel:
		g.awaitRel.remove(string(e.client), e.pid)
	case evSubscribe:
		c := string(e.client)
		if g.subs[c] == nil {
			g.subs[c] = map[string]subscription{}
		}
		g.subs[c][string(e.topic)] = e.sub
	case evUnsubscribe:
		delete(g.subs[string(e.client)], string(e.topic))
		if len(g.subs[string(e.client)]) == 0 {
			delete(g.subs, string(e.client))
		}
	}
}

// emitSummary passes a summary to the Output with its mark, unless a
// replay finds it already stored.
func (g *Gateway) emitSummary(s aggregate.Summary) {
	if m, ok := g.nextMark(); ok {
		g.out.Summary(s, m)
	}
}

func (g *Gateway) emitDeadLetter(d bridge.DeadLetter) {
	g.recent[g.recentNext%len(g.recent)] = RecentDeadLetter{At: d.ReceivedAt.UTC(), Reason: d.Reason, Device: d.Device, Topic: d.Topic, Detail: d.Detail}
	g.recentNext++
	if m, ok := g.nextMark(); ok {
		g.out.DeadLetter(d, m)
	}
}

// RecentDeadLetter is one of the latest dead letters, for the status page.
type RecentDeadLetter struct {
	At                            time.Time
	Reason, Device, Topic, Detail string
}

// maxDeviceStats caps the devices listed in Stats (the status page's
// table); the rest are counted in Devices.
const maxDeviceStats = 1000

func (g *Gateway) nextMark() (bridge.Mark, bool) {
	g.cur.N++
	if !g.cur.After(g.suppress) {
		g.suppressed.Add(1)
		return g.cur, false
	}
	return g.cur, true
}

// Addr returns the address the MQTT listener is bound to.
func (g *Gateway) Addr() string { return g.addr }

// TLSAddr returns the address of the MQTT over TLS listener, if any.
func (g *Gateway) TLSAddr() string { return g.tlsAddr }

// WebSocketAddr returns the address of the WebSocket listener, if any.
func (g *Gateway) WebSocketAddr() string { return g.wsAddr }

// loadUsers reads mqtt.users_file, if set.
func loadUsers(cfg *configs.Config) (Users, error) {
	if cfg.MQTT.UsersFile == "" {
		return Users{}, nil
	}
	users, err := LoadUsers(cfg.MQTT.UsersFile)
	if err != nil {
		return nil, fmt.Errorf("mqtt.users_file: %w", err)
	}
	return users, nil
}

// Reload reads the users file and the TLS certificate, key and client CA
// files again (on SIGHUP). Connected clients keep their sessions; new
// connections use what was read. On error nothing changes.
func (g *Gateway) Reload() error {
	users, err := loadUsers(g.cfg)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if g.tls != nil {
		if err := g.tls.Reload(); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
	}
	g.hook.auth.setUsers(users)
	g.log.Info("reloaded users and certificates", "users", len(users), "tls", g.tls != nil)
	return nil
}

// Run serves MQTT until ctx is cancelled. It owns the journal's goroutines,
// the idle-close tick and checkpoints. Shutdown follows the data: stop
// accepting and disconnect clients, journal and apply what is pending,
// close every open window so its summary reaches the Output, and write a
// checkpoint. It returns after the broker's goroutines and its own have
// stopped; an error means the journal failed (a write or fsync) and the
// process must stop.
func (g *Gateway) Run(ctx context.Context) error {
	jctx, jcancel := context.WithCancel(context.Background())
	defer jcancel()
	jdone := make(chan error, 1)
	go func() { jdone <- g.j.Run(jctx) }()
	if err := g.server.Serve(); err != nil {
		jcancel()
		<-jdone
		g.closeFiles()
		return fmt.Errorf("start mqtt broker: %w", err)
	}
	g.log.Info("mqtt broker listening", "addr", g.addr, "tls", g.tlsAddr, "websocket", g.wsAddr,
		"anonymous", g.cfg.MQTT.AllowAnonymous, "topics", g.cfg.MQTT.Topics)
	sctx, scancel := context.WithCancel(ctx)
	var sensors sync.WaitGroup
	for _, st := range g.sensors {
		sensors.Add(1)
		go func() {
			defer sensors.Done()
			g.runSensor(sctx, st)
		}()
	}
	defer func() { scancel(); sensors.Wait() }()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	every := g.cfg.Storage.CheckpointInterval.D()
	cpTicker := time.NewTicker(every)
	defer cpTicker.Stop()
	for {
		select {
		case <-t.C:
			// Only ticks that can change something are journaled, so an
			// idle gateway does not fsync every second.
			g.mu.Lock()
			due := g.agg.TickDue(g.now())
			g.mu.Unlock()
			if due {
				g.j.clock(evTick) // an error here is the journal's failure, reported below
			}
		case <-cpTicker.C:
			if !g.checkpointDue() {
				continue
			}
			if err := g.checkpoint(); err != nil {
				g.server.Close()
				jcancel()
				<-jdone
				g.closeFiles()
				return err
			}
		case err := <-jdone:
			g.log.Error("ingest journal failed; stopping (nothing more is acknowledged)", "err", err)
			g.server.Close()
			g.closeFiles()
			return err
		case <-ctx.Done():
			scancel()
			sensors.Wait()
			g.server.Close()
			if b, err := g.j.clock(evFlush); err == nil {
				b.wait()
			}
			jcancel()
			if err := <-jdone; err != nil {
				g.closeFiles()
				return err
			}
			g.mu.Lock()
			open := g.agg.OpenWindows()
			g.mu.Unlock()
			err := g.checkpoint()
			if cerr := g.closeFiles(); err == nil {
				err = cerr
			}
			g.log.Info("mqtt broker stopped; open windows closed", "windows", open)
			return err
		}
	}
}

// Checkpoints are written at most every storage.checkpoint_interval, and
// only once the journal has grown by as much as the last checkpoint's size
// since it (so that checkpoints at most double what is written to the SD
// card), or by maxReplayBytes, which bounds the replay at restart (about
// 0.5 s).
const maxReplayBytes = 64 << 20

func (g *Gateway) checkpointDue() bool {
	since := g.j.written.Load() - g.cpWritten.Load()
	return since >= g.cpSize.Load() || since >= maxReplayBytes
}

// checkpoint makes the outputs so far durable, then writes the state as of
// the latest applied event (and the closed windows changed since the last
// checkpoint) in one transaction, then removes the journal segments no
// longer needed. It holds the aggregator throughout, so that no window it
// hands over can leave the RAM cache before it is on disk; acknowledgements
// do not wait for it. An error is a failed disk: the process must stop.
func (g *Gateway) checkpoint() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.applied == g.lastCP {
		return nil
	}
	written := g.j.written.Load() // at least what was applied
	if err := g.out.Sync(); err != nil {
		return err
	}
	c := checkpoint{seq: g.applied, clock: g.clock.UnixNano(), snapshot: g.agg.AppendSnapshot, sessions: g.sessions, rings: g.dup.rings, awaitRel: g.awaitRel, subs: g.subs}
	data := c.encode()
	windows, deleted, err := g.state.commit(data, g.agg)
	if err != nil {
		g.cpFailures.Add(1)
		return fmt.Errorf("write checkpoint to %s: %w", g.state.path, err)
	}
	g.lastCP = c.seq
	g.cpWritten.Store(written)
	g.cpSize.Store(int64(len(data) + 100*windows))
	g.log.Debug("checkpoint written", "seq", c.seq, "bytes", len(data), "windows_stored", windows, "windows_expired", deleted)
	if err := g.jlog.DropBefore(c.seq + 1); err != nil {
		g.log.Error("ingest journal segments not removed", "err", err)
	}
	return nil
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
	Sessions    int // persistent MQTT sessions kept across restarts

	Duplicates uint64 // QoS 1/2 resends of journaled publications, not counted again
	// MQTTRefused counts the clients and packets the broker turned away,
	// by reason (see Refusal).
	MQTTRefused map[string]int64
	Throttled   uint64 // publications held back by mqtt.publish_rate_per_client
	Sockets     int64  // MQTT sockets open, CONNECT sent or not
	BytesIn     int64  // MQTT bytes received
	BytesOut    int64  // MQTT bytes sent
	Journal     JournalStats
	Sensors     []SensorStatus `json:",omitempty"`
	// DeviceList is up to 1,000 devices, in order of first reading.
	DeviceList []aggregate.DeviceStat
	// RecentDeadLetters are the latest dead letters, newest first.
	RecentDeadLetters []RecentDeadLetter
}

// JournalStats describes the ingest journal and the last recovery.
type JournalStats struct {
	Bytes              int64  // on disk
	Applied            uint64 // sequence of the latest event applied
	Checkpoint         uint64 // sequence of the latest checkpoint
	CheckpointFailures uint64
	Replayed           uint64 // events replayed at start
	Suppressed         uint64 // outputs of replayed events found already stored
	Truncated          int64  // bytes cut from a torn journal tail at start
	Lost               uint64 // records in damaged journal segments
	BadRecords         uint64 // undecodable records skipped
	FsyncLatency       Histogram
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
		Sessions:    len(g.sessions),
	}
	s.Journal.Applied, s.Journal.Checkpoint = g.applied, g.lastCP
	g.agg.DeviceStats(func(d aggregate.DeviceStat) bool {
		s.DeviceList = append(s.DeviceList, d)
		return len(s.DeviceList) < maxDeviceStats
	})
	for i := range min(g.recentNext, len(g.recent)) {
		s.RecentDeadLetters = append(s.RecentDeadLetters, g.recent[(g.recentNext-1-i)%len(g.recent)])
	}
	g.mu.Unlock()
	js := g.jlog.Stats()
	s.Journal.Bytes, s.Journal.Truncated, s.Journal.Lost = js.Bytes, js.Truncated, js.Lost
	s.Journal.CheckpointFailures, s.Journal.Replayed = g.cpFailures.Load(), g.replayed.Load()
	s.Journal.Suppressed, s.Journal.BadRecords = g.suppressed.Load(), g.badEvents.Load()
	s.Duplicates = g.duplicates.Load()
	s.Sensors = g.sensorStatus()
	s.BytesIn, s.BytesOut = atomic.LoadInt64(&g.server.Info.BytesReceived), atomic.LoadInt64(&g.server.Info.BytesSent)
	s.Journal.FsyncLatency = g.j.fsync.snapshot()
	s.Clients = atomic.LoadInt64(&g.server.Info.ClientsConnected)
	s.Publishes = g.publishes.Load()
	s.Refused = g.refused.Load()
	s.MQTTRefused = g.mqttRefused.snapshot()
	s.Throttled = g.throttled.Load()
	s.Sockets = g.connsOpen.Load()
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
