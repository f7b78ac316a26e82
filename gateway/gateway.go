// Package gateway is the ingest path between the MQTT broker and the
// outbound queue. The broker (package broker) journals every publication
// on a reading topic in the ingest journal (package journal) and
// acknowledges it once the journal has it on disk; the journal's applier
// then hands each durable batch to the Gateway, which decodes it (package
// payload) into readings and folds them into the aggregator. Summaries and
// dead letters go to an Output, each marked with the journal event that
// made it, so that replaying the journal after a crash makes no output
// twice.
//
// The Gateway also owns checkpoints (the aggregator's state, persistent
// sessions and duplicate detection, written to the state file, after which
// the journal is trimmed), the idle-close tick, the gateway's own I²C
// sensors, and the counters of all of it (Stats).
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/queue"
	"github.com/edgegate/edgegate/gateway/broker"
	"github.com/edgegate/edgegate/gateway/clock"
	"github.com/edgegate/edgegate/gateway/internal/lograte"
	"github.com/edgegate/edgegate/gateway/journal"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sensors"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// Gateway is the ingest path with the broker in front of it. Create it
// with New, start it with Run.
type Gateway struct {
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	clk    clock.Clock
	out    Output
	broker *broker.Broker
	dec    *payload.Decoder
	jlog   *queue.Log // the ingest journal, <data_dir>/ingest
	j      *journal.Journal
	state  *journal.StateDB // checkpoint and closed windows, <data_dir>/state/state.db
	// holdLog keeps the readings stamped while the clock is not
	// synchronized, <data_dir>/hold (hold.go).
	holdLog *queue.Log

	mu       sync.Mutex // serialises applying events: the aggregator, ing and what follows
	agg      *aggregate.Aggregator
	ing      ingestHandler
	tl       timeline // the aggregator's clock: the gateway and elapsed time of the latest event applied
	cw       clockWatch
	cur      Mark   // the event being applied, and its outputs so far
	suppress Mark   // outputs up to this mark are already stored (replay)
	applied  uint64 // journal sequence of the latest event applied
	sessions map[string]journal.Session
	awaitRel journal.PIDSets                            // QoS 2 publications received (PUBREC sent) whose PUBREL has not come
	subs     map[string]map[string]journal.Subscription // client → filter → subscription
	dup      *journal.Dedupe
	lastCP   uint64 // sequence of the latest checkpoint written
	ticks    uint64 // ticks applied (replayed ones included)

	replaying bool         // the journal is being replayed (recover)
	hold      journal.Hold // what the hold log holds (hold.go)
	holdMark  uint64       // journal sequence of the last publication in the hold log at start
	holdBuf   []byte

	sensors *sensors.Poller // the gateway's own I²C sensors; nil without any

	sp      *sparkplug.Host // the Sparkplug B host state (under mu); nil unless Options.Sparkplug
	serving atomic.Bool     // the broker serves: rebirth requests are published

	recent     [20]RecentDeadLetter // the latest dead letters, a ring (under mu)
	recentNext int
	// deadLetters counts the dead letters emitted since start by their
	// (first) reason (under mu): a fixed vocabulary, capped at
	// maxDeadReasons all the same.
	deadLetters map[string]uint64

	cpWritten atomic.Int64 // journal bytes written when the latest checkpoint was taken
	cpSize    atomic.Int64 // its size

	rejected      [numReasons]atomic.Uint64 // payloads or items refused by the decoder, by reason
	publishes     atomic.Uint64             // publications on reading topics
	duplicates    atomic.Uint64             // QoS 1/2 resends of journaled publications, not counted again
	notAllowed    atomic.Uint64             // readings naming a device their publisher may not publish for
	badEvents     atomic.Uint64             // journal records that could not be decoded
	suppressed    atomic.Uint64             // outputs not made again during replay
	replayed      atomic.Uint64             // journal events replayed at start
	cpFailures    atomic.Uint64             // checkpoints that could not be written
	stateRebuilds atomic.Uint64             // state files rebuilt at start
	stateRecovery atomic.Value              // string: what the rebuild found and did
	logLimiter    lograte.Limiter
}

// New opens the ingest journal in o.DataDir, rebuilds the state from the
// latest checkpoint and the journal after it, creates the broker and binds
// its listeners. The clock is o.Clock; without one, now (time.Now if nil)
// taken as synchronized (clock.FromWall). Nothing runs until Run.
func New(o Options, out Output, log *slog.Logger, now func() time.Time) (*Gateway, error) {
	if now == nil {
		now = time.Now
	}
	if o.Clock == nil {
		o.Clock = clock.FromWall(now)
	}
	now = o.Clock.Now
	if o.DeadLetterPayload <= 0 {
		o.DeadLetterPayload = DefaultDeadLetterPayload
	}
	dec, err := payload.NewDecoder(o.Topics, o.MaxPayload)
	if err != nil {
		return nil, fmt.Errorf("mqtt.topics: %w", err)
	}
	g := &Gateway{opts: o, log: log, now: now, clk: o.Clock, tl: newTimeline(), out: out, dec: dec, sessions: map[string]journal.Session{}, awaitRel: journal.PIDSets{},
		subs: map[string]map[string]journal.Subscription{},
		dup:  journal.NewDedupe(maxDedupeClients)}
	g.logLimiter.Every = 10 * time.Second
	g.ing.g = g
	if o.Sparkplug != nil {
		g.sp = sparkplug.New(*o.Sparkplug)
	}
	g.agg, err = aggregate.New(o.Aggregate, aggClock{&g.tl}, g.emitSummary)
	if err != nil {
		return nil, fmt.Errorf("aggregate: %w", err)
	}
	// The users file, ACLs and certificates are read before anything on
	// disk is touched, so that a mistake in them stops the start at once.
	if g.broker, err = broker.New(o.Broker, g, log, now); err != nil {
		return nil, err
	}
	if err := g.recover(); err != nil {
		return nil, err
	}
	g.j = journal.New(g.jlog, journal.Options{Interval: o.FsyncInterval, Now: now, Mono: g.clk.Monotonic, Apply: g.apply, Ack: g.broker.WriteAcks})
	s := g.cw.init(g.clk)
	g.j.SetClock(clockState(g.clk.BootID(), s))
	log.Info("gateway clock", "synchronized", s.Synchronized, "source", s.Source, "max_error", s.MaxError.String(),
		"time", g.clk.Now().UTC(), "boot", g.clk.BootID())
	if err := g.broker.Listen(g.j); err != nil {
		g.closeFiles()
		return nil, err
	}
	if len(o.Sensors) > 0 {
		g.sensors, err = sensors.New(sensors.Options{Sensors: o.Sensors, OpenBus: o.OpenBus, Topic: o.SensorTopic,
			Publish: g.publishLocal, Now: now, Log: log})
		if err != nil {
			g.broker.Close()
			g.closeFiles()
			return nil, err
		}
	}
	return g, nil
}

// ReadingTopic reports whether topic matches a reading pattern (and is
// journaled). It is the broker's question (broker.Ingest).
func (g *Gateway) ReadingTopic(topic string) bool {
	if _, ok := g.sparkplugTopic(topic); ok {
		return true
	}
	for _, p := range g.dec.Patterns() {
		if _, _, ok := p.Match(topic); ok {
			return true
		}
	}
	return false
}

// publishLocal journals a reading of the gateway's own sensors as a QoS 0
// publication of client, and publishes it on the broker for local
// subscribers.
func (g *Gateway) publishLocal(client, topic string, payload []byte) error {
	if err := g.j.Local(client, topic, payload); err != nil {
		return err // the journal failed; Run reports it
	}
	g.broker.Publish(topic, payload) // the hook does not take inline publications
	return nil
}

var _ broker.Ingest = (*Gateway)(nil)
var _ broker.Journal = (*journal.Journal)(nil)

// Full reports that the output is over its quota (broker.Ingest).
func (g *Gateway) Full() bool { return g.out.Full() }

// recover opens the journal and the state file, loads the checkpoint and
// replays the journal after it. Outputs that the Output already stored are
// not made again, so the queue ends up as if there had been no crash.
func (g *Gateway) recover() error {
	start := time.Now()
	dir := g.opts.DataDir
	var err error
	// The state file first: its lock keeps a second gateway from
	// recovering (truncating) a journal that another one is writing.
	stateDir := filepath.Join(dir, "state")
	if err := queue.MkdirDurable(stateDir); err != nil {
		return fmt.Errorf("gateway.data_dir: %w", err)
	}
	g.state, err = journal.OpenStateDB(filepath.Join(stateDir, "state.db"),
		journal.StateOptions{Log: g.log, Quarantine: filepath.Join(dir, "quarantine"), Position: func() uint64 { return g.applied }})
	if err != nil {
		return fmt.Errorf("gateway.data_dir: %w", err)
	}
	rec := g.state.Recovery()
	if rec.Rebuilt {
		g.stateRebuilds.Add(1)
		g.stateRecovery.Store(rec.String())
	}
	g.jlog, err = queue.Open(filepath.Join(dir, "ingest"), queue.Options{Logger: g.log.With("component", "journal")})
	if err != nil {
		g.state.Close()
		return fmt.Errorf("gateway.data_dir: open ingest journal: %w", err)
	}
	// Small segments: released ones are removed whole, after a checkpoint.
	g.holdLog, err = queue.Open(filepath.Join(dir, "hold"), queue.Options{SegmentBytes: 4 << 20, Logger: g.log.With("component", "hold")})
	if err != nil {
		g.closeFiles()
		return fmt.Errorf("gateway.data_dir: open hold log: %w", err)
	}
	fail := func(err error) error {
		g.closeFiles()
		return err
	}
	var cp *journal.Checkpoint
	blob, err := g.state.Checkpoint()
	if err != nil {
		return fail(fmt.Errorf("read checkpoint: %w", err))
	}
	if blob != nil {
		if cp, err = journal.DecodeCheckpoint(blob); err != nil {
			// The windows stored with it no longer match any state: start
			// again from what the journal holds.
			g.log.Error("checkpoint damaged; replaying the journal from its first record without the stored windows", "err", err)
			if err := g.state.ClearWindows(); err != nil {
				return fail(fmt.Errorf("clear stored windows: %w", err))
			}
		}
	}
	js := g.jlog.Stats()
	from := uint64(1)
	g.suppress = g.out.Stored()
	if cp != nil {
		if js.Next <= cp.Seq {
			// The journal is behind the checkpoint: it was removed or
			// replaced. Its sequence numbers start again, so marks of
			// stored outputs say nothing about the new events.
			g.log.Error("ingest journal is older than the checkpoint (was it deleted?); starting from the checkpoint's state",
				"checkpoint", cp.Seq, "journal_next", js.Next)
			cp.Seq = js.Next - 1
			g.suppress = Mark{}
		}
		g.tl = restoredTimeline(cp)
		if err := g.agg.Restore(cp.Agg); err != nil {
			// Typically aggregate.window was changed: windows of the old
			// size cannot continue.
			g.log.Error("aggregator state in the checkpoint does not fit the configuration; its open and stored windows are discarded",
				"err", err)
			if err := g.state.ClearWindows(); err != nil {
				return fail(fmt.Errorf("clear stored windows: %w", err))
			}
		}
		g.sessions, g.dup.Rings, g.awaitRel, g.subs = cp.Sessions, cp.Rings, cp.AwaitRel, cp.Subs
		g.restoreSparkplug(cp.Sparkplug)
		g.applied, g.lastCP = cp.Seq, cp.Seq
		from = cp.Seq + 1
	}
	g.agg.SetStore(g.state)
	if js.First > from {
		g.log.Error("ingest journal records missing before the replay start; their readings are lost",
			"want_from", from, "journal_first", js.First)
	}
	if err := g.reportRebuild(rec, cp, js); err != nil {
		return fail(err)
	}
	g.restoreHold(cp)
	n, err := g.replay(from)
	if err != nil {
		return fail(err)
	}
	g.state.EndReplay()
	if n > 0 || cp != nil || js.Truncated > 0 {
		g.log.Info("state recovered", "checkpoint", g.lastCP, "replayed_events", n, "outputs_already_stored", g.suppressed.Load(),
			"journal_truncated_bytes", js.Truncated, "open_windows", g.agg.OpenWindows(), "sessions", len(g.sessions),
			"took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// reportRebuild logs what a rebuilt state file kept and lost, and, when
// closed windows stored before the replay start may be missing, marks
// them lost in the state file: a late reading for one of them is then
// refused (late_state_evicted) rather than starting a revision 0 that
// would contradict the summaries already sent. Windows are stored before
// the checkpoint's clock (or, without one, the journal's first event)
// plus aggregate.max_future_skew, how far ahead of the clock a device's
// watermark, and so a closed window, can be.
func (g *Gateway) reportRebuild(rec journal.Recovery, cp *journal.Checkpoint, js queue.Stats) error {
	if !rec.Rebuilt {
		if rec.Damage != "" {
			g.log.Error("previous checkpoint unusable; set aside (the next checkpoint writes it again)",
				"damage", rec.Damage, "quarantined", rec.Quarantined)
		}
		return nil
	}
	args := []any{"damage", rec.Damage, "quarantined", rec.Quarantined, "windows_kept", rec.WindowsKept,
		"windows_newer_than_checkpoint", rec.WindowsAhead, "windows_dropped", rec.WindowsDropped, "damaged_window_pages", rec.DamagedPages}
	if cp != nil {
		args = append(args, "checkpoint", cp.Seq, "checkpoint_from", rec.From)
	} else {
		args = append(args, "checkpoint", "none: the state is rebuilt from the journal alone", "journal_first", js.First)
	}
	var at int64
	switch {
	case cp != nil:
		at = cp.Clock
	case js.First > 1:
		if at = g.firstEventTime(js.First); at == 0 { // an empty journal
			at = g.now().UnixNano()
		}
	}
	if !rec.WindowsLost || at == 0 {
		// Nothing lost, or the journal holds every event since the
		// first: replaying it rebuilds every window.
		g.log.Error("state file rebuilt; nothing acknowledged is lost", args...)
		return nil
	}
	before := at + int64(g.opts.Aggregate.MaxFutureSkew)
	args = append(args, "windows_lost_before", time.Unix(0, before).UTC())
	g.log.Error("state file rebuilt; closed windows it held before windows_lost_before may be lost: "+
		"late readings for those are refused (late_state_evicted) instead of revising them", args...)
	if err := g.state.MarkLost(before); err != nil {
		return fmt.Errorf("mark lost windows: %w", err)
	}
	return nil
}

// firstEventTime returns the time of the journal's record seq, 0 if it
// cannot be read.
func (g *Gateway) firstEventTime(seq uint64) int64 {
	r := g.jlog.NewReader(seq)
	defer r.Close()
	if _, rec, err := r.Next(); err == nil {
		if e, err := journal.DecodeEvent(rec); err == nil {
			return e.At
		}
	}
	return 0
}

// closeFiles closes the journal and the state file.
func (g *Gateway) closeFiles() error {
	var herr error
	if g.holdLog != nil {
		herr = g.holdLog.Close()
	}
	return errors.Join(g.jlog.Close(), g.state.Close(), herr)
}

// replay applies the durable journal records from sequence from on.
func (g *Gateway) replay(from uint64) (int, error) {
	r := g.jlog.NewReader(from)
	defer r.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.replaying = true
	defer func() { g.replaying = false }()
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
	g.cur = Mark{Seq: seq}
	e, err := journal.DecodeEvent(rec)
	if err != nil {
		g.badEvents.Add(1)
		g.log.Error("ingest journal record undecodable; skipped", "seq", seq, "err", err)
		return
	}
	g.tl.advance(&e) // a step is logged by watchClock, as it happens
	now := time.Unix(0, g.tl.clock)
	switch e.Kind {
	case journal.KindPublish:
		if e.Flags&journal.FlagQoSMask > 0 {
			h := journal.ContentHash(e.Topic, e.Payload)
			if g.dup.Publication(e.Client, e.PID, h, e.Flags&journal.FlagDup != 0, seq) {
				g.duplicates.Add(1)
				return
			}
		}
		if e.Flags&journal.FlagQoSMask == 2 {
			g.awaitRel.Add(string(e.Client), e.PID)
		}
		g.ing.device = unsafe.String(unsafe.SliceData(e.Device), len(e.Device))
		g.ing.local = e.Flags&journal.FlagLocal != 0
		g.ingestLocked(unsafe.String(unsafe.SliceData(e.Topic), len(e.Topic)),
			unsafe.String(unsafe.SliceData(e.Client), len(e.Client)), e.Payload, now)
		g.ing.device, g.ing.local = "", false
	case journal.KindTick:
		g.ticks++
		g.dup.Bounded()
		g.expireSparkplug()
		g.agg.Tick()
	case journal.KindFlush:
		g.agg.Flush()
	case journal.KindSessionStart: // a clean start journals an end first; every connection of a persistent session journals one
		g.sessions[string(e.Client)] = e.Session
		g.dup.Connected(e.Client, seq)
	case journal.KindSessionEnd:
		g.dup.Drop(e.Client)
		delete(g.sessions, string(e.Client))
		delete(g.awaitRel, string(e.Client))
		delete(g.subs, string(e.Client))
	case journal.KindPubrel:
		g.awaitRel.Remove(string(e.Client), e.PID)
		g.dup.Released(e.Client, e.PID)
	case journal.KindReceived:
		g.dup.Received(e.Client, e.Upto)
	case journal.KindSubscribe:
		c := string(e.Client)
		if g.subs[c] == nil {
			g.subs[c] = map[string]journal.Subscription{}
		}
		g.subs[c][string(e.Topic)] = e.Sub
	case journal.KindUnsubscribe:
		delete(g.subs[string(e.Client)], string(e.Topic))
		if len(g.subs[string(e.Client)]) == 0 {
			delete(g.subs, string(e.Client))
		}
	}
	g.checkHold(seq)
}

// emitSummary passes a summary to the Output with its mark, unless a
// replay finds it already stored.
func (g *Gateway) emitSummary(s aggregate.Summary) {
	if m, ok := g.nextMark(); ok {
		g.out.Summary(s, m)
	}
}

func (g *Gateway) emitDeadLetter(d DeadLetter) {
	g.recent[g.recentNext%len(g.recent)] = RecentDeadLetter{At: d.ReceivedAt.UTC(), Reason: d.Reason, Device: d.Device, Topic: d.Topic, Detail: d.Detail}
	g.recentNext++
	if m, ok := g.nextMark(); ok {
		if g.deadLetters == nil {
			g.deadLetters = map[string]uint64{}
		}
		if _, known := g.deadLetters[d.Reason]; known || len(g.deadLetters) < maxDeadReasons {
			g.deadLetters[d.Reason]++
		}
		g.out.DeadLetter(d, m)
	}
}

// maxDeadReasons bounds Stats.DeadLetters; the reasons are the decoder's
// and the aggregator's (about 30).
const maxDeadReasons = 64

// maxDedupeClients caps the clients whose duplicate detection is kept;
// sessions (mqtt.max_sessions) and connections (mqtt.max_clients) are
// capped far below, so it only bounds a journal written under other
// limits.
const maxDedupeClients = 100_000

// maxDeviceStats caps the devices listed in Stats (the status page's
// table); the rest are counted in Devices.
const maxDeviceStats = 1000

func (g *Gateway) nextMark() (Mark, bool) {
	g.cur.N++
	if !g.cur.After(g.suppress) {
		g.suppressed.Add(1)
		return g.cur, false
	}
	return g.cur, true
}

// Addr returns the address the plain MQTT listener is bound to, if any.
func (g *Gateway) Addr() string { return g.broker.Addr() }

// TLSAddr returns the address of the MQTT over TLS listener, if any.
func (g *Gateway) TLSAddr() string { return g.broker.TLSAddr() }

// Listeners reports whether each MQTT listener accepts connections
// (see broker.ListenerStatus). It takes no lock of the gateway's.
func (g *Gateway) Listeners() []broker.ListenerStatus { return g.broker.Listeners() }

// WebSocketAddr returns the address of the WebSocket listener, if any.
func (g *Gateway) WebSocketAddr() string { return g.broker.WebSocketAddr() }

// Reload reads the users file and the TLS certificate, key and client CA
// files again (on SIGHUP); see broker.Broker.Reload.
func (g *Gateway) Reload() error { return g.broker.Reload() }

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
	// The host's STATE is retained before any client can connect: a
	// host application that subscribes as soon as it is let in gets it
	// retained, not a live copy it may miss.
	g.publishState(true)
	// mochi reads the restored sessions as it starts; nothing is applied
	// meanwhile.
	g.mu.Lock()
	err := g.broker.Serve(broker.Restored{Sessions: g.sessions, Subscriptions: g.subs, AwaitingRelease: g.awaitRel})
	g.mu.Unlock()
	if err != nil {
		g.broker.Close() // the listeners Listen bound
		jcancel()
		<-jdone
		g.closeFiles()
		return err
	}
	g.serving.Store(true)
	g.log.Info("mqtt broker listening", "addr", g.Addr(), "tls", g.TLSAddr(), "websocket", g.WebSocketAddr(),
		"anonymous", g.opts.Broker.AllowAnonymous, "topics", g.opts.Topics)
	sctx, scancel := context.WithCancel(ctx)
	var sensorsDone sync.WaitGroup
	if g.sensors != nil {
		sensorsDone.Go(func() { g.sensors.Run(sctx) })
	}
	defer func() { scancel(); sensorsDone.Wait() }()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	every := g.opts.CheckpointInterval
	cpTicker := time.NewTicker(every)
	defer cpTicker.Stop()
	for {
		select {
		case <-t.C:
			g.watchClock()
			// Only ticks that can change something are journaled, so an
			// idle gateway does not fsync every second.
			g.mu.Lock()
			el := g.tl.elapsedAt(g.clk.BootID(), g.clk.Monotonic(), g.clk.Now())
			due := g.agg.TickDue(el) || g.holdDue(el) || g.sparkplugDue(el)
			g.mu.Unlock()
			if due {
				g.j.Clock(journal.KindTick) // an error here is the journal's failure, reported below
			}
		case <-cpTicker.C:
			if !g.checkpointDue() {
				continue
			}
			if err := g.checkpoint(); err != nil {
				g.broker.Close()
				jcancel()
				<-jdone
				g.closeFiles()
				return err
			}
		case err := <-jdone:
			g.log.Error("ingest journal failed; stopping (nothing more is acknowledged)", "err", err)
			g.broker.Close()
			g.closeFiles()
			return err
		case <-ctx.Done():
			scancel()
			sensorsDone.Wait()
			g.publishState(false)
			g.serving.Store(false)
			g.broker.Close()
			if b, err := g.j.Clock(journal.KindFlush); err == nil {
				b.Wait()
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
	since := g.j.Written() - g.cpWritten.Load()
	return since >= g.cpSize.Load() || since >= maxReplayBytes
}

// checkpoint makes the outputs so far durable, then writes the state as of
// the latest applied event (and the closed windows changed since the last
// checkpoint) in one transaction, then removes the journal segments before
// the previous checkpoint. It holds the aggregator throughout, so that no
// window it hands over can leave the RAM cache before it is on disk;
// acknowledgements do not wait for it. An error is a failed disk: the
// process must stop.
func (g *Gateway) checkpoint() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.applied == g.lastCP {
		return nil
	}
	written := g.j.Written() // at least what was applied
	if err := g.out.Sync(); err != nil {
		return err
	}
	if err := g.holdLog.Sync(); err != nil {
		g.cpFailures.Add(1)
		return fmt.Errorf("sync hold log: %w", err)
	}
	// The clock as of the latest event, but never ahead of now: a forward
	// glitch since undone does not outlive a restart.
	clk := min(g.tl.clock, g.clk.Now().UnixNano()+g.tl.Offset)
	c := journal.Checkpoint{Seq: g.applied, Clock: clk, Snapshot: g.agg.AppendSnapshot, Sessions: g.sessions, Rings: g.dup.Rings, AwaitRel: g.awaitRel, Subs: g.subs,
		Time: g.tl.TimeLine, Hold: g.hold, Sparkplug: g.sparkplugSnapshot()}
	data := c.Encode()
	windows, deleted, err := g.state.Commit(c.Seq, data, g.agg)
	if err != nil {
		g.cpFailures.Add(1)
		return fmt.Errorf("write checkpoint to %s: %w", g.state.Path, err)
	}
	// The journal is kept back to the checkpoint before this one (now in
	// checkpoint.prev), which recovery uses if this one is damaged.
	prev := g.lastCP
	g.lastCP = c.Seq
	g.cpWritten.Store(written)
	// The checkpoint is written twice: here, and as the previous one
	// before the next.
	g.cpSize.Store(int64(2*len(data) + 100*windows))
	g.log.Debug("checkpoint written", "seq", c.Seq, "bytes", len(data), "windows_stored", windows, "windows_expired", deleted)
	if err := g.jlog.DropBefore(prev + 1); err != nil {
		g.log.Error("ingest journal segments not removed", "err", err)
	}
	if err := g.holdLog.DropBefore(g.hold.Start); err != nil {
		g.log.Error("hold log segments not removed", "err", err)
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
	Series      int // series held in memory (aggregate.max_series bounds them)
	Retained    int
	Devices     int
	// SkewedDevices counts devices whose clocks are off the gateway's
	// synchronized clock by more than aggregate.max_device_skew (see
	// DeviceList for each one's offset).
	SkewedDevices int
	Sessions      int // persistent MQTT sessions kept across restarts
	// SessionsEvicted counts persistent sessions ended early to make room
	// (mqtt.max_sessions, mqtt.max_sessions_per_identity).
	SessionsEvicted uint64

	Duplicates uint64 // QoS 1/2 resends of journaled publications, not counted again
	// DuplicateEntries is what duplicate detection holds: publications
	// whose acknowledgement their client may not have received (24 bytes
	// each), of all clients.
	DuplicateEntries int
	// DuplicatesEvicted counts entries dropped at their bound (journal:
	// DefaultPerClient, DefaultTotal), oldest first: their receipt was not
	// learnt, and a resend of one would count again.
	DuplicatesEvicted uint64
	// AcksUndelivered counts PUBACKs owed to connections that closed
	// first (their clients resend, and duplicate detection answers);
	// FlowHeld publications whose reading waited while their client had
	// mqtt.receive_maximum in flight.
	AcksUndelivered, FlowHeld uint64
	// AcksReceived counts the acknowledgements clients are known to have
	// received (from their TCP acknowledgements): duplicate detection
	// forgets those publications.
	AcksReceived uint64
	// NotAllowed counts readings dead-lettered as device_not_allowed: they
	// named a device other than their device-role publisher's own.
	NotAllowed uint64
	// MQTTRefused counts the clients and packets the broker turned away,
	// by reason (see Refusal).
	MQTTRefused map[string]int64
	Throttled   uint64 // publications held back by mqtt.publish_rate_per_client
	Sockets     int64  // MQTT sockets open, CONNECT sent or not
	BytesIn     int64  // MQTT bytes received
	BytesOut    int64  // MQTT bytes sent
	Journal     JournalStats
	Clock       ClockStats
	Hold        HoldStats        // readings stamped while the clock is not synchronized, held for it
	Sensors     []sensors.Status `json:",omitempty"`

	// MQTTRetained and MQTTRetainedBytes are the retained messages the
	// broker keeps (mqtt.max_retained*).
	MQTTRetained      int
	MQTTRetainedBytes int64
	// MQTTQueuedBytes is what the broker holds for subscribers (QoS 1/2
	// messages in flight or queued for away sessions);
	// MQTTQueuedDropped counts the messages dropped for a session, by the
	// bound reached (mqtt.max_queued_bytes*).
	MQTTQueuedBytes   int64
	MQTTQueuedDropped map[string]int64
	// MQTTPending is the MQTT sockets that have not sent CONNECT yet;
	// MQTTMaxSockets the MQTT sockets the file limit leaves room for (0:
	// no limit); MQTTListeners whether each listener accepts.
	MQTTPending    int
	MQTTMaxSockets int
	MQTTListeners  []broker.ListenerStatus
	// DeviceList is up to 1,000 devices, in order of first reading.
	DeviceList []aggregate.DeviceStat
	// RecentDeadLetters are the latest dead letters, newest first.
	RecentDeadLetters []RecentDeadLetter
	// DeadLetters counts the dead letters sent since start (those a
	// replay found already stored are not counted again), by reason: the
	// first reason of each (see DeadLetter.Reason).
	DeadLetters map[string]uint64
	// Sparkplug is the Sparkplug B host's state and counters; nil unless
	// sparkplug.enabled.
	Sparkplug *sparkplug.Stats `json:",omitempty"`
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
	// StateRebuilds counts state files (state/state.db) found damaged or
	// lost at start and rebuilt; StateRecovery says what was found, what
	// the state was rebuilt from, and what was kept and lost.
	StateRebuilds uint64
	StateRecovery string `json:",omitempty"`
	FsyncLatency  journal.Histogram
	// PendingWaits counts publications that waited because
	// journal.DefaultMaxPending bytes were waiting for the card (a slow
	// fsync); their clients' sockets were not read meanwhile.
	PendingWaits uint64
}

// Stats returns a snapshot of the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	c := g.agg.Counts()
	s := Stats{
		OpenWindows:   g.agg.OpenWindows(),
		Series:        g.agg.Series(),
		Retained:      g.agg.Retained(),
		Devices:       g.agg.Devices(),
		SkewedDevices: g.agg.SkewedDevices(),
		Summaries:     c.Summaries,
		Sessions:      len(g.sessions),

		DuplicateEntries:  g.dup.Entries(),
		DuplicatesEvicted: g.dup.Evicted,
	}
	s.Journal.Applied, s.Journal.Checkpoint = g.applied, g.lastCP
	s.Clock = g.cw.clockStats(g.tl.Offset)
	s.Hold = g.holdStats()
	g.agg.DeviceStats(func(d aggregate.DeviceStat) bool {
		s.DeviceList = append(s.DeviceList, d)
		return len(s.DeviceList) < maxDeviceStats
	})
	if g.sp != nil {
		sp := g.sp.Stats()
		s.Sparkplug = &sp
	}
	s.DeadLetters = maps.Clone(g.deadLetters)
	if s.DeadLetters == nil {
		s.DeadLetters = map[string]uint64{}
	}
	for i := range min(g.recentNext, len(g.recent)) {
		s.RecentDeadLetters = append(s.RecentDeadLetters, g.recent[(g.recentNext-1-i)%len(g.recent)])
	}
	g.mu.Unlock()
	js := g.jlog.Stats()
	s.Journal.Bytes, s.Journal.Truncated, s.Journal.Lost = js.Bytes, js.Truncated, js.Lost
	s.Journal.CheckpointFailures, s.Journal.Replayed = g.cpFailures.Load(), g.replayed.Load()
	s.Journal.Suppressed, s.Journal.BadRecords = g.suppressed.Load(), g.badEvents.Load()
	s.Journal.StateRebuilds = g.stateRebuilds.Load()
	s.Journal.StateRecovery, _ = g.stateRecovery.Load().(string)
	s.Duplicates = g.duplicates.Load()
	s.NotAllowed = g.notAllowed.Load()
	if g.sensors != nil {
		s.Sensors = g.sensors.Status()
	}
	bs := g.broker.Stats()
	s.BytesIn, s.BytesOut = bs.BytesIn, bs.BytesOut
	s.Journal.FsyncLatency = g.j.FsyncLatency()
	s.Journal.PendingWaits = g.j.PendingWaits()
	s.Clients = bs.Clients
	s.Publishes = g.publishes.Load()
	s.Refused = bs.QuotaRefused
	s.MQTTRefused = bs.Refused
	s.Throttled, s.Sockets = bs.Throttled, bs.Sockets
	s.MQTTPending, s.MQTTMaxSockets, s.MQTTListeners = bs.Pending, bs.MaxSockets, bs.Listeners
	s.SessionsEvicted = bs.SessionsEvicted
	s.AcksUndelivered, s.FlowHeld, s.AcksReceived = bs.AcksUndelivered, bs.FlowHeld, bs.AcksReceived
	s.MQTTRetained, s.MQTTRetainedBytes = bs.Retained, bs.RetainedBytes
	s.MQTTQueuedBytes, s.MQTTQueuedDropped = bs.QueuedBytes, bs.QueuedDropped
	s.Outcomes = map[string]uint64{}
	for o := range aggregate.Outcome(aggregate.NumOutcomes) {
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
