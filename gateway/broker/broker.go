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
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgegate/edgegate/gateway/internal/lograte"
	"github.com/edgegate/edgegate/gateway/journal"
)

// Journal is where the broker writes what must survive a restart: each
// publication on a reading topic (before it is acknowledged), and the
// life of persistent sessions. *journal.Journal implements it.
type Journal interface {
	// Publish journals a publication; with ack set, the journal sends the
	// PUBACK (through WriteAcks) once it is durable. device, if not empty,
	// is the only device the publication's readings may name.
	Publish(client, device string, ackTo any, flags byte, pid uint16, topic string, payload []byte, ack bool) (*journal.Batch, error)
	SessionStart(client string, s journal.Session) error
	SessionEnd(client string) error
	Subscribe(client, filter string, s journal.Subscription) error
	Unsubscribe(client, filter string) error
	Pubrel(client string, pid uint16) error
}

// Ingest is what the broker asks of the rest of the gateway.
type Ingest interface {
	// ReadingTopic reports whether a topic carries readings (and is
	// journaled).
	ReadingTopic(topic string) bool
	// Full reports that the output is over its quota: QoS 1/2 readings
	// are then refused, so that devices keep them.
	Full() bool
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
	Roles         map[string]Role
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
	MaxKeepAlive           time.Duration
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

// Role is a set of topic filters, in which {username} stands for the
// client's identity and {clientid} for its client id, each filling whole
// topic levels.
type Role struct {
	Publish, Subscribe []string
}

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
	tls    *serverTLS // nil without a TLS listener

	addr, tlsAddr, wsAddr string

	// restored is the journaled session state, read by mochi's Stored*
	// hooks while Serve runs.
	restored Restored

	logLimiter  lograte.Limiter
	mqttRefused refusals      // clients and packets turned away, by reason
	connsOpen   atomic.Int64  // sockets open, CONNECT sent or not
	throttled   atomic.Uint64 // publications held back by PublishRate
	quota       atomic.Uint64 // QoS 1/2 publications refused because the output was full
}

// New creates the broker and binds its listeners. Nothing is served until
// Serve.
func New(o Options, j Journal, in Ingest, log *slog.Logger, now func() time.Time) (*Broker, error) {
	if now == nil {
		now = time.Now
	}
	b := &Broker{opts: o, log: log, now: now, j: j, in: in}
	b.logLimiter.Every = 10 * time.Second
	users, err := b.loadUsers()
	if err != nil {
		return nil, err
	}
	rules, err := newACL(o.Roles, o.Users, o.CertRoles, o.AnonymousRole)
	if err != nil {
		return nil, err
	}
	if o.TLS.Listen != "" || o.WebSocket.TLS {
		if b.tls, err = newServerTLS(o.TLS); err != nil {
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
	b.server = mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  o.ClientReadBuffer,
		ClientNetWriteBufferSize: o.ClientWriteBuffer,
		Logger:                   slog.New(newQuietHandler(log.Handler())).With("component", "mqtt"),
		SysTopicResendInterval:   30,
		InlineClient:             true, // publishes the gateway's sensor readings to local subscribers
	})
	b.hook = &hook{b: b, auth: newAuthenticator(users, o.AllowAnonymous), acl: rules,
		conns: newConnLimiter(o.ConnectRate, o.ConnectBurst, o.ConnectRateExempt)}
	if err := b.server.AddHook(b.hook, nil); err != nil {
		return nil, fmt.Errorf("add mqtt hook: %w", err)
	}
	add := func(key string, l listeners.Listener) (string, error) {
		if err := b.server.AddListener(&guarded{Listener: l, b: b}); err != nil {
			b.server.Close()
			return "", fmt.Errorf("%s %s: %w", key, l.Address(), err)
		}
		return l.Address(), nil
	}
	if o.Listen != "" {
		if b.addr, err = add("mqtt.listen", listeners.NewTCP(listeners.Config{ID: "tcp", Address: o.Listen})); err != nil {
			return nil, err
		}
	}
	if o.TLS.Listen != "" {
		l := listeners.NewTCP(listeners.Config{ID: "tls", Address: o.TLS.Listen, TLSConfig: b.tls.Config()})
		if b.tlsAddr, err = add("mqtt.tls.listen", l); err != nil {
			return nil, err
		}
	}
	if o.WebSocket.Listen != "" {
		lc := listeners.Config{ID: "ws", Address: o.WebSocket.Listen}
		if o.WebSocket.TLS {
			lc.TLSConfig = b.tls.Config()
		}
		if b.wsAddr, err = add("mqtt.websocket.listen", newWSListener(lc.ID, lc.Address, lc.TLSConfig, o.WebSocket.AllowedOrigins, b)); err != nil {
			return nil, err
		}
	}
	return b, nil
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
	return nil
}

// Close disconnects every client and closes the listeners.
func (b *Broker) Close() error { return b.server.Close() }

// Publish publishes a message from the broker itself (the gateway's own
// sensor readings) to local subscribers. The hook does not journal it.
func (b *Broker) Publish(topic string, payload []byte) error {
	return b.server.Publish(topic, payload, false, 0)
}

// Addr returns the address the plain MQTT listener is bound to, if any.
func (b *Broker) Addr() string { return b.addr }

// TLSAddr returns the address of the MQTT over TLS listener, if any.
func (b *Broker) TLSAddr() string { return b.tlsAddr }

// WebSocketAddr returns the address of the WebSocket listener, if any.
func (b *Broker) WebSocketAddr() string { return b.wsAddr }

// loadUsers reads mqtt.users_file, if set.
func (b *Broker) loadUsers() (Users, error) {
	if b.opts.UsersFile == "" {
		return Users{}, nil
	}
	users, err := LoadUsers(b.opts.UsersFile)
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
	b.hook.auth.setUsers(users)
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
}

// Stats returns a snapshot of the counters.
func (b *Broker) Stats() Stats {
	return Stats{
		Clients:      atomic.LoadInt64(&b.server.Info.ClientsConnected),
		Sockets:      b.connsOpen.Load(),
		BytesIn:      atomic.LoadInt64(&b.server.Info.BytesReceived),
		BytesOut:     atomic.LoadInt64(&b.server.Info.BytesSent),
		Refused:      b.mqttRefused.snapshot(),
		Throttled:    b.throttled.Load(),
		QuotaRefused: b.quota.Load(),
		Sessions:     b.hook.sessions.len(),

		SessionsEvicted: b.hook.sessions.evicted.Load(),
	}
}

// WriteAcks sends the PUBACKs of a durable journal batch (the journal's
// acker calls it), one write per client. A PUBACK with reason Success and
// no properties is four bytes in MQTT 3.1.1 and 5 alike. The write is made
// under the client's lock, as mochi's own writes are, with a deadline so
// that one client that stopped reading cannot hold up the others; such a
// client is disconnected (its unacknowledged publications are resent on
// reconnect and recognised as duplicates).
func WriteAcks(acks []journal.PendingAck) {
	byClient := map[*mqtt.Client][]byte{}
	var order []*mqtt.Client
	for _, a := range acks {
		cl := a.To.(*mqtt.Client)
		b, ok := byClient[cl]
		if !ok {
			order = append(order, cl)
		}
		byClient[cl] = append(b, 0x40, 0x02, byte(a.PID>>8), byte(a.PID))
	}
	for _, cl := range order {
		if err := writeRaw(cl, byClient[cl]); err != nil {
			cl.Stop(fmt.Errorf("write puback: %w", err))
		}
	}
}

func writeRaw(cl *mqtt.Client, b []byte) error {
	cl.Lock()
	defer cl.Unlock()
	if cl.Closed() || cl.Net.Conn == nil {
		return nil // gone: the client resends on reconnect
	}
	conn := cl.Net.Conn
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := conn.Write(b)
	conn.SetWriteDeadline(time.Time{})
	return err
}
