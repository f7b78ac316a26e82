// Package broker is the gateway's MQTT front door: the embedded mochi
// broker with edgegate's hook. It establishes who a client is (TLS client
// certificate, bcrypt users file, or client id), applies role ACLs,
// serves plain, TLS and WebSocket listeners (certificates reloaded on
// SIGHUP), guards each connection (connect deadline, per-address connect
// rate, decoder panics, refusals counted by reason), and hands every
// publication on a reading topic to the ingest journal before it is
// acknowledged.
//
// The broker knows the journal only through the Journal interface below
// and the rest of the gateway through Ingest; it decodes no payload and
// keeps no state that must survive a restart: sessions and subscriptions
// are journaled, and given back to mochi at start by Serve.
package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgegate/edgegate/gateway/broker/auth"
	"github.com/edgegate/edgegate/gateway/broker/ws"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgegate/edgegate/gateway/internal/lograte"
	"github.com/edgegate/edgegate/gateway/internal/ratelimit"
	"github.com/edgegate/edgegate/gateway/journal"
)

// Journal is where the broker writes what must survive a restart: each
// publication on a reading topic (before it is acknowledged), and the
// life of persistent sessions. *journal.Journal implements it.
type Journal interface {
	// Publish journals a publication; with ack set, the journal sends the
	// PUBACK (through Broker.WriteAcks, to ackTo) once it is durable.
	// device, if not empty, is the only device the publication's readings
	// may name.
	// It returns the batch and the publication's index in it.
	Publish(client, device string, ackTo any, flags byte, pid uint16, topic string, payload []byte, ack bool) (*journal.Batch, int, error)
	// Received journals that a client has received the acknowledgements
	// of its publications journaled up to upto.
	Received(client string, upto uint64) error
	SessionStart(client string, s journal.Session) error
	SessionEnd(client string) error
	Subscribe(client, filter string, s journal.Subscription) error
	Unsubscribe(client, filter string) error
	// Pubrel journals the end of a QoS 2 exchange; PUBCOMP waits for the
	// batch to be durable.
	Pubrel(client string, pid uint16) (*journal.Batch, error)
}

// Ingest is what the broker asks of the rest of the gateway.
type Ingest interface {
	// ReadingTopic reports whether a topic carries readings (and is
	// journaled).
	ReadingTopic(topic string) bool
	// Full reports that the output is over its quota: QoS 1/2 readings
	// are then refused, so that devices keep them.
	Full() bool
	// WillTopic reports whether a client's will on topic is journaled as
	// the client's publication when the broker sends it (a Sparkplug
	// NDEATH). mochi publishes wills without OnPublish.
	WillTopic(topic string) bool
}

// Options configures the broker; they are mqtt.* of the configuration.
type Options struct {
	Listen    string // plain TCP; empty: no plain listener
	TLS       TLSOptions
	WebSocket WebSocketOptions

	AllowAnonymous bool
	UsersFile      string // "username:bcrypt-hash" lines; empty: no users
	// Roles are the ACL roles by name (device, subscriber, admin and any
	// configured); Users gives a username a role and CertRoles a client
	// certificate's name (separate namespaces; others are devices);
	// AnonymousRole is the role of anonymous clients.
	Roles         map[string]Filters
	Users         map[string]string
	CertRoles     map[string]string
	AnonymousRole string

	MaxPacket         int // bytes
	ReceiveMaximum    int
	ClientWriteQueue  int // packets queued for writing per client
	ClientReadBuffer  int // bytes
	ClientWriteBuffer int // bytes
	TopicAliasMaximum int
	MaxSessionExpiry  time.Duration
	// MaxSessions and MaxSessionsPerIdentity cap the persistent sessions
	// kept, connected or not; ClientIDs binds device client ids to their
	// identity.
	MaxSessions            int
	MaxSessionsPerIdentity int
	ClientIDs              ClientIDRule
	MaxClients             int
	MaxSubscriptions       int           // per client
	ConnectTimeout         time.Duration // from accept to CONNECT
	ConnectRate            float64       // new connections per second per source address; 0: no limit
	ConnectBurst           int
	ConnectRateExempt      []string // CIDR prefixes
	PublishRate            float64  // publications per second per client; 0: no limit
	PublishBytesRate       float64  // bytes (topic and payload) published per second per client; 0: no limit
	PublishBytesBurst      int      // bytes a client may publish at once (at least MaxPacket)
	PingRate               float64  // PINGREQs per second per client (bursts of pingBurst); faster ones disconnect it; 0: no limit
	MaxKeepAlive           time.Duration
	// PasswordChecks bounds the bcrypt comparisons running at once
	// (CONNECTs whose password is not cached); 0: half of GOMAXPROCS, at
	// least 1. A CONNECT that finds no slot within auth.SlotWait is
	// refused as server busy.
	PasswordChecks int
	// WriteTimeout bounds every write to a client socket; a client that
	// does not take one within it is disconnected. Required.
	WriteTimeout time.Duration
	// ReceiptMargin: a PUBACK counts as received once the connection
	// outlived the client's TCP acknowledgement of it by this much
	// (receipts.go); 0 is DefaultReceiptMargin.
	ReceiptMargin time.Duration

	// Retained bounds the retained messages kept (retained.go).
	Retained RetainedLimits
	// MaxQueuedBytesPerSession and MaxQueuedBytes bound the QoS 1/2
	// messages held for subscribers, per session and in all (queued.go).
	MaxQueuedBytesPerSession int64
	MaxQueuedBytes           int64

	// MaxPendingConnects bounds the sockets that have not sent CONNECT
	// (within connect_timeout), MaxPendingConnectsPerAddress those from
	// one address (IPv6: one /64); more are closed at accept; 0: no
	// limit. The file limit may lower the first (see newSocketBudget).
	MaxPendingConnects           int
	MaxPendingConnectsPerAddress int
}

// TLSOptions is the MQTT over TLS listener.
type TLSOptions struct {
	Listen            string // empty: no TLS listener
	CertFile, KeyFile string
	// ClientCAFile, if set, verifies client certificates against these
	// CAs; a verified certificate's common name (or first DNS name) is the
	// client's identity.
	ClientCAFile      string
	RequireClientCert bool
}

// WebSocketOptions is the MQTT over WebSocket listener.
type WebSocketOptions struct {
	Listen string // empty: no WebSocket listener
	TLS    bool   // wss://, with the TLS listener's certificate
	// AllowedOrigins are the web origins (scheme://host[:port]) whose
	// pages may connect, "*" for any; a handshake with another Origin
	// header is refused. Clients that send none (not browsers) connect.
	AllowedOrigins []string
}

// Filters is a role's topic filters (see auth.Filters).
type Filters = auth.Filters

// Broker is the embedded MQTT broker. Create it with New, start it with
// Serve, stop it with Close.
type Broker struct {
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	j      Journal
	in     Ingest
	server *mqtt.Server
	hook   *hook
	bounds *bounds         // the second hook: what is held for clients
	tls    *auth.ServerTLS // nil without a TLS listener

	addr, tlsAddr, wsAddr string

	// restored is the journaled session state, read by mochi's Stored*
	// hooks while Serve runs.
	restored Restored

	logLimiter  lograte.Limiter
	mqttRefused refusals      // clients and packets turned away, by reason
	connsOpen   atomic.Int64  // sockets open, CONNECT sent or not
	throttled   atomic.Uint64 // publications held back by PublishRate
	quota       atomic.Uint64 // QoS 1/2 publications refused because the output was full
	// acksUndelivered counts PUBACKs owed to connections that closed
	// before they were written; flowHeld publications whose reading waited
	// for the client's publications in flight (mqtt.receive_maximum).
	acksUndelivered atomic.Uint64
	acksReceived    atomic.Uint64 // acknowledgements known received (receipts.go)
	flowHeld        atomic.Uint64
	stopReceipts    chan struct{}  // closed by Close
	receiptsDone    sync.WaitGroup // watchReceipts

	gate      *gate                    // admits sockets within the budget (Listen makes it)
	listeners []listeners.Listener     // ours, as bound by Listen
	health    map[string]*acceptHealth // by listener id
	serving   atomic.Bool              // Serve started the listeners
	// listen binds the TCP and TLS listeners' addresses: net.Listen, or
	// a test's wrapper.
	listen func(network, addr string) (net.Listener, error)

	connMu   sync.Mutex
	stopping bool                  // Close has begun: no more connections are tracked
	conns    map[net.Conn]struct{} // every connection the guard runs
	connWG   sync.WaitGroup        // their goroutines

	closeOnce sync.Once
	closeErr  error // Close's

	ackMu  sync.Mutex     // guards closed and adding to ackers
	closed bool           // Close was called: no more PUBACK writers
	ackers sync.WaitGroup // the clients' PUBACK writers (ackWriter.run)
}

// New creates the broker: it reads the users file, compiles the ACLs and
// loads the TLS certificates. Listen binds the listeners; nothing is served
// until Serve.
func New(o Options, in Ingest, log *slog.Logger, now func() time.Time) (*Broker, error) {
	if now == nil {
		now = time.Now
	}
	if o.WriteTimeout <= 0 {
		return nil, fmt.Errorf("mqtt.write_timeout: %s is not positive", o.WriteTimeout)
	}
	b := &Broker{opts: o, log: log, now: now, in: in, stopReceipts: make(chan struct{})}
	b.logLimiter.Every = 10 * time.Second
	users, err := b.loadUsers()
	if err != nil {
		return nil, err
	}
	rules, err := auth.NewACL(o.Roles, o.Users, o.CertRoles, o.AnonymousRole)
	if err != nil {
		return nil, err
	}
	if o.TLS.Listen != "" || o.WebSocket.TLS {
		if b.tls, err = auth.NewServerTLS(auth.TLSFiles{CertFile: o.TLS.CertFile, KeyFile: o.TLS.KeyFile, ClientCAFile: o.TLS.ClientCAFile, RequireClientCert: o.TLS.RequireClientCert}); err != nil {
			return nil, err
		}
	}
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(o.ClientWriteQueue)
	caps.MaximumPacketSize = uint32(o.MaxPacket)
	caps.ReceiveMaximum = uint16(o.ReceiveMaximum)
	caps.MaximumSessionExpiryInterval = uint32(o.MaxSessionExpiry.Seconds())
	caps.MaximumMessageExpiryInterval = 24 * 3600
	caps.MaximumClients = int64(o.MaxClients)
	caps.TopicAliasMaximum = uint16(o.TopicAliasMaximum)
	// mochi copies a PUBLISH's properties (its user properties) into the
	// PUBACK or PUBREC it answers with: 4 bytes become tens on every
	// publication, and MQTT 5 clients (Eclipse paho's test client) choke
	// on acknowledgements with properties they did not expect.
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	b.server = mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  o.ClientReadBuffer,
		ClientNetWriteBufferSize: o.ClientWriteBuffer,
		Logger:                   slog.New(lograte.NewHandler(log.Handler())).With("component", "mqtt"),
		SysTopicResendInterval:   30,
		InlineClient:             true, // publishes the gateway's sensor readings to local subscribers
	})
	checks := o.PasswordChecks
	if checks <= 0 {
		// Half the cores: the other half keeps up with the devices
		// already connected while a flood of wrong passwords lasts.
		checks = max(1, runtime.GOMAXPROCS(0)/2)
	}
	b.hook = &hook{b: b, auth: auth.NewAuthenticator(users, o.AllowAnonymous, checks), acl: rules,
		conns: ratelimit.NewPerAddress(o.ConnectRate, o.ConnectBurst, o.ConnectRateExempt)}
	if err := b.server.AddHook(b.hook, nil); err != nil {
		return nil, fmt.Errorf("add mqtt hook: %w", err)
	}
	b.bounds = newBounds(b)
	if err := b.server.AddHook(b.bounds, nil); err != nil {
		return nil, fmt.Errorf("add mqtt hook: %w", err)
	}
	return b, nil
}

// Listen binds the listeners; the broker journals into j from then on.
// It reads the process's file limit (RLIMIT_NOFILE) to bound the MQTT
// sockets (see newSocketBudget).
func (b *Broker) Listen(j Journal) error {
	b.j = j
	o := b.opts
	budget := newSocketBudget(o, fileLimit())
	b.gate = newGate(b, budget, o.ConnectRateExempt)
	b.health = map[string]*acceptHealth{}
	b.conns = map[net.Conn]struct{}{}
	if budget.lowered {
		b.log.Warn("mqtt.max_pending_connects lowered to fit the file limit; raise LimitNOFILE to keep it",
			"configured", budget.configured, "max_pending_connects", budget.maxPending, "file_limit", budget.fileLimit, "reserved", fileReserve)
	}
	if budget.maxSockets > 0 && budget.configSocks > budget.maxSockets {
		b.log.Warn("the file limit holds fewer MQTT sockets than mqtt.max_clients and mqtt.max_pending_connects; more are refused (file_limit); raise LimitNOFILE",
			"mqtt_sockets", budget.maxSockets, "file_limit", budget.fileLimit, "reserved", fileReserve)
	}
	var err error
	add := func(key string, l listeners.Listener, h *acceptHealth) (string, error) {
		if err := b.server.AddListener(&guarded{Listener: l, b: b}); err != nil {
			b.server.Close()
			return "", fmt.Errorf("%s %s: %w", key, l.Address(), err)
		}
		b.listeners = append(b.listeners, l)
		b.health[l.ID()] = h
		return l.Address(), nil
	}
	if o.Listen != "" {
		l := newTCPListener(b, "tcp", o.Listen, nil)
		if b.addr, err = add("mqtt.listen", l, l.health); err != nil {
			return err
		}
	}
	if o.TLS.Listen != "" {
		l := newTCPListener(b, "tls", o.TLS.Listen, b.tls.Config())
		if b.tlsAddr, err = add("mqtt.tls.listen", l, l.health); err != nil {
			return err
		}
	}
	if o.WebSocket.Listen != "" {
		var tc *tls.Config
		if o.WebSocket.TLS {
			tc = b.tls.Config()
		}
		h := &acceptHealth{id: "ws"}
		l := ws.New(h.id, o.WebSocket.Listen, tc, ws.Config{AllowedOrigins: o.WebSocket.AllowedOrigins, HandshakeTimeout: o.ConnectTimeout,
			Refused: b.refusedOrigin, Log: b.log,
			Accept: func(ln net.Listener) net.Listener { return newAcceptor(ln, b, b.gate, h) }})
		if b.wsAddr, err = add("mqtt.websocket.listen", l, h); err != nil {
			return err
		}
	}
	return nil
}

// Restored is the session state the journal rebuilt at start: persistent
// sessions, their subscriptions, and QoS 2 exchanges awaiting PUBREL.
type Restored struct {
	Sessions        map[string]journal.Session
	Subscriptions   map[string]map[string]journal.Subscription // client → filter → subscription
	AwaitingRelease journal.PIDSets
}

// Serve gives mochi the restored sessions and starts the listeners. The
// maps of r are read before Serve returns and not kept; the caller must
// not change them meanwhile.
func (b *Broker) Serve(r Restored) error {
	b.restored = r
	defer func() { b.restored = Restored{} }()
	if err := b.server.Serve(); err != nil {
		return fmt.Errorf("start mqtt broker: %w", err)
	}
	b.receiptsDone.Go(func() { b.watchReceipts(b.stopReceipts) })
	b.serving.Store(true)
	return nil
}

// refusedOrigin counts and logs a WebSocket handshake refused for its web
// origin.
func (b *Broker) refusedOrigin(origin, remote string) {
	b.mqttRefused[RefusedWebSocketOrigin].Add(1)
	if ok, held := b.logLimiter.Allow("ws-origin", b.now()); ok {
		b.log.Warn("websocket connection refused: its web origin is not in mqtt.websocket.allowed_origins",
			"origin", origin, "remote", remote, "suppressed_since_last", held)
	}
}

// Close stops the listeners, disconnects every client, waits for their
// connections to end, then for the PUBACK writers to stop (at most
// mqtt.write_timeout). It never takes mochi's own path to the clients
// (see shutdown). Calls after the first return its error.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

func (b *Broker) close() error {
	b.shutdown()
	err := b.server.Close()
	b.ackMu.Lock()
	if !b.closed {
		close(b.stopReceipts)
	}
	b.closed = true
	b.ackMu.Unlock()
	b.ackers.Wait()
	b.receiptsDone.Wait()
	return err
}

// Publish publishes a message from the broker itself (the gateway's own
// sensor readings) to local subscribers. The hook does not journal it.
func (b *Broker) Publish(topic string, payload []byte) error {
	return b.server.Publish(topic, payload, false, 0)
}

// PublishRetained publishes a retained QoS 1 message from the broker
// itself (the Sparkplug host's STATE). The hook does not journal it.
func (b *Broker) PublishRetained(topic string, payload []byte) error {
	return b.server.Publish(topic, payload, true, 1)
}

// Addr returns the address the plain MQTT listener is bound to, if any.
func (b *Broker) Addr() string { return b.addr }

// TLSAddr returns the address of the MQTT over TLS listener, if any.
func (b *Broker) TLSAddr() string { return b.tlsAddr }

// WebSocketAddr returns the address of the WebSocket listener, if any.
func (b *Broker) WebSocketAddr() string { return b.wsAddr }

// loadUsers reads mqtt.users_file, if set.
func (b *Broker) loadUsers() (auth.Users, error) {
	if b.opts.UsersFile == "" {
		return auth.Users{}, nil
	}
	users, err := auth.LoadUsers(b.opts.UsersFile)
	if err != nil {
		return nil, fmt.Errorf("mqtt.users_file: %w", err)
	}
	return users, nil
}

// Reload reads the users file and the TLS certificate, key and client CA
// files again (on SIGHUP). Connected clients keep their sessions; new
// connections use what was read. On error nothing changes.
func (b *Broker) Reload() error {
	users, err := b.loadUsers()
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if b.tls != nil {
		if err := b.tls.Reload(); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
	}
	b.hook.auth.SetUsers(users)
	b.log.Info("reloaded users and certificates", "users", len(users), "tls", b.tls != nil)
	return nil
}

// Stats is a snapshot of the broker's counters.
type Stats struct {
	Clients      int64            // connected clients
	Sockets      int64            // sockets open, CONNECT sent or not
	BytesIn      int64            // MQTT bytes received
	BytesOut     int64            // MQTT bytes sent
	Refused      map[string]int64 // clients and packets turned away, by reason (see Refusal)
	Throttled    uint64           // publications held back by PublishRate
	QuotaRefused uint64           // QoS 1/2 publications refused because the output was full
	Sessions     int              // persistent sessions held, connected or not
	// SessionsEvicted counts persistent sessions ended early to make room
	// for a new one (MaxSessions, MaxSessionsPerIdentity).
	SessionsEvicted uint64
	// AcksUndelivered counts PUBACKs owed to connections that closed
	// before they were written: their clients resend the publications, and
	// duplicate detection answers them.
	AcksUndelivered uint64
	// AcksReceived counts the acknowledgements (PUBACK, PUBREC) clients
	// are known to have received: their publications are never resent.
	AcksReceived uint64
	// FlowHeld counts QoS 1/2 publications whose reading waited while
	// their client had mqtt.receive_maximum in flight (or 16 times as many
	// whose acknowledgement it was not known to have received).
	FlowHeld uint64
	// Retained and RetainedBytes are the retained messages kept (those of
	// clients and the gateway's own; not mochi's $SYS ones).
	Retained      int
	RetainedBytes int64
	// QueuedBytes is what is held for subscribers: QoS 1/2 messages in
	// flight or queued for away sessions; QueuedDropped counts the
	// messages not queued for a session, by the bound that was reached
	// (see Drop).
	QueuedBytes   int64
	QueuedDropped map[string]int64
	// Pending is the sockets that have not sent CONNECT; MaxSockets the
	// MQTT sockets the file limit leaves room for (RLIMIT_NOFILE less a
	// reserve; 0: no limit); Listeners whether each listener accepts.
	Pending    int
	MaxSockets int
	Listeners  []ListenerStatus
}

// Stats returns a snapshot of the counters.
func (b *Broker) Stats() Stats {
	var pending int
	if b.gate != nil {
		_, pending = b.gate.counts()
	}
	s := Stats{
		Clients:      atomic.LoadInt64(&b.server.Info.ClientsConnected),
		Sockets:      b.connsOpen.Load(),
		BytesIn:      atomic.LoadInt64(&b.server.Info.BytesReceived),
		BytesOut:     atomic.LoadInt64(&b.server.Info.BytesSent),
		Refused:      b.mqttRefused.snapshot(),
		Throttled:    b.throttled.Load(),
		QuotaRefused: b.quota.Load(),
		Sessions:     b.hook.sessions.len(),

		SessionsEvicted: b.hook.sessions.evicted.Load(),
		AcksUndelivered: b.acksUndelivered.Load(),
		AcksReceived:    b.acksReceived.Load(),
		FlowHeld:        b.flowHeld.Load(),

		Pending:    pending,
		MaxSockets: b.gateBudget().maxSockets,
		Listeners:  b.Listeners(),
	}
	s.Retained, s.RetainedBytes = b.bounds.retained.held()
	s.QueuedBytes, s.QueuedDropped = b.bounds.queued.held()
	return s
}

// WriteAcks sends the PUBACKs of a durable journal batch (the journal's
// acker calls it). It never waits for a client: each client's PUBACKs are
// appended to its ackWriter, in journal order, and written by that
// client's writer goroutine (at most one at a time per client), so a
// client that stops reading holds up only its own PUBACKs, until
// mqtt.write_timeout disconnects it. PUBACKs owed to a connection that
// closed first are counted (Stats.AcksUndelivered): the client resends
// those publications and duplicate detection answers them.
func (b *Broker) WriteAcks(acks []journal.PendingAck) {
	var start []*ackWriter
	for _, a := range acks {
		w := a.To.(*ackWriter)
		if w.add(a.PID, a.Seq) {
			start = append(start, w)
		}
	}
	if len(start) == 0 {
		return
	}
	b.ackMu.Lock()
	defer b.ackMu.Unlock()
	if b.closed {
		for _, w := range start {
			w.dropPending()
		}
		return
	}
	for _, w := range start {
		b.ackers.Go(w.run)
	}
}

// ackWriter writes the PUBACKs the journal sends to one connection, holds
// the connection's publications to mqtt.receive_maximum in flight, and
// follows which acknowledgements the client has received (receipts.go).
type ackWriter struct {
	cl *mqtt.Client
	b  *Broker

	// unwritten1 is the connection's QoS 1 publications the journal is to
	// acknowledge whose PUBACK is not yet written; open2 its QoS 2
	// exchanges whose PUBREL has not come. (mochi counts only those it
	// acknowledges itself.)
	unwritten1 atomic.Int32
	open2      atomic.Int32
	subscribed atomic.Bool // the client subscribed on this connection: write through mochi

	mu      sync.Mutex
	pending []byte // PUBACKs to write, in journal order
	n       int32  // PUBACKs in pending
	last    uint64 // journal sequence of the latest publication in pending
	running bool   // a writer goroutine owns pending
	// unwritten counts PUBACKs promised (OnPublish) and not yet written
	// or dropped; drained is closed when it reaches 0.
	unwritten int
	drained   chan struct{}
	// changed is closed (and replaced) when a PUBACK is written or a
	// receipt is learnt: a publication held by flow control looks again.
	changed chan struct{}
	rc      receipts
}

// promise counts a QoS 1 publication whose PUBACK the journal will send.
func (w *ackWriter) promise() {
	w.unwritten1.Add(1)
	w.mu.Lock()
	w.unwritten++
	w.mu.Unlock()
}

// broken undoes promise for a publication the journal refused.
func (w *ackWriter) broken() {
	w.unwritten1.Add(-1)
	w.sent(1, 0, false)
}

// add queues a PUBACK for the publication journaled as seq and reports
// whether a writer must be started.
func (w *ackWriter) add(pid uint16, seq uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	// A PUBACK with reason Success and no properties is four bytes in
	// MQTT 3.1.1 and 5 alike.
	w.pending = append(w.pending, 0x40, 0x02, byte(pid>>8), byte(pid))
	w.n++
	w.last = max(w.last, seq)
	if w.running {
		return false
	}
	w.running = true
	return true
}

// dropPending counts the PUBACKs pending as undelivered (the broker is
// closed: no writer starts).
func (w *ackWriter) dropPending() {
	w.mu.Lock()
	n := w.n
	w.pending, w.n, w.running = w.pending[:0], 0, false
	w.mu.Unlock()
	w.unwritten1.Add(-n)
	w.b.acksUndelivered.Add(uint64(n))
	w.sent(int(n), 0, false)
}

// run writes what is pending until nothing is.
func (w *ackWriter) run() {
	var buf []byte
	for {
		w.mu.Lock()
		n, last := w.n, w.last
		if n == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		buf, w.pending, w.n = w.pending, buf[:0], 0
		w.mu.Unlock()
		w.write(buf, n, last)
	}
}

// write writes n PUBACKs, the latest of publication last, under the
// client's lock, as mochi's own writes are (the connection's deadline
// bounds the wait). A failed write ends the connection: its
// unacknowledged publications are resent on reconnect and recognised as
// duplicates.
//
// A client that subscribed may have packets of mochi's waiting in mochi's
// write buffer (it buffers while the client's outbound queue is not
// empty, and a PUBACK mochi wrote for an earlier publication may be among
// them, even after the client unsubscribed); its PUBACKs are then written
// through mochi, after them, so that none overtakes
// [MQTT-4.6.0-2]. A client that only publishes never has any.
func (w *ackWriter) write(buf []byte, n int32, last uint64) {
	cl := w.cl
	var err error
	if w.subscribed.Load() || cl.State.Subscriptions.Len() > 0 { // resumed sessions subscribe without SUBSCRIBE
		for i := 0; i+4 <= len(buf) && err == nil; i += 4 {
			err = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: uint16(buf[i+2])<<8 | uint16(buf[i+3])})
		}
	} else {
		cl.Lock()
		if cl.Closed() || cl.Net.Conn == nil {
			err = mqtt.ErrConnectionClosed
		} else {
			_, err = cl.Net.Conn.Write(buf)
		}
		cl.Unlock()
	}
	if err != nil && !errors.Is(err, mqtt.ErrConnectionClosed) {
		cl.Stop(fmt.Errorf("write puback: %w", err))
	}
	ok := err == nil
	// The quota is freed once the PUBACKs are written (or will never
	// be): the client's next publication may then be read.
	w.unwritten1.Add(-n)
	if !ok {
		w.b.acksUndelivered.Add(uint64(n))
	}
	w.sent(int(n), last, ok)
}

// sent counts n promised PUBACKs as written (ok, the latest for the
// publication journaled as last) or dropped, and wakes a publication held
// by flow control.
func (w *ackWriter) sent(n int, last uint64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ok {
		w.rc.written(last, uint64(n))
	}
	w.unwritten -= n
	if w.unwritten <= 0 && w.drained != nil {
		close(w.drained)
		w.drained = nil
	}
	w.wakeLocked()
}

// wakeLocked wakes the publication held by flow control, if any.
func (w *ackWriter) wakeLocked() {
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// waitWritten waits, at most d, until the PUBACKs promised so far are
// written: mochi acknowledges the publications the journal does not
// (QoS 1 routed or retained), and a client's PUBACKs must go out in the
// order of its publications [MQTT-4.6.0-2]. Only the client's own
// goroutine waits.
func (w *ackWriter) waitWritten(d time.Duration) {
	w.mu.Lock()
	if w.unwritten <= 0 {
		w.mu.Unlock()
		return
	}
	if w.drained == nil {
		w.drained = make(chan struct{})
	}
	ch := w.drained
	w.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// released counts the end of a QoS 2 exchange, never below zero: those
// restored at start were not counted.
func (w *ackWriter) released() {
	for {
		n := w.open2.Load()
		if n <= 0 || w.open2.CompareAndSwap(n, n-1) {
			return
		}
	}
}
