package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Refusal is a reason the broker turned a client or a packet away.
type Refusal int

// Reasons for refusals, counted in Stats.Refused.
const (
	RefusedCredentials       Refusal = iota // CONNACK 0x86 / 3.1.1 code 5
	RefusedPublish                          // ACL: PUBACK 0x87, dropped (QoS 0) or 3.1.1 disconnect
	RefusedSubscribe                        // ACL: SUBACK 0x87
	RefusedSubscriptionLimit                // SUBACK 0x87: mqtt.max_subscriptions_per_client
	RefusedConnectRate                      // CONNACK 0x9F / 3.1.1 code 3
	RefusedConnectTimeout                   // socket closed: no CONNECT within mqtt.connect_timeout
	RefusedServerBusy                       // CONNACK 0x89 / 3.1.1 code 3: mqtt.max_clients
	RefusedPacketTooLarge                   // DISCONNECT 0x95: mqtt.max_packet_bytes
	RefusedReceiveMaximum                   // DISCONNECT 0x93
	RefusedTopicAlias                       // DISCONNECT 0x94
	RefusedMalformed                        // malformed or protocol-violating packet
	RefusedPanic                            // the packet decoder panicked; the connection was closed
	RefusedTLSHandshake                     // TLS handshake failed: old version, unknown client CA, not TLS
	RefusedWriteTimeout                     // disconnected: a write waited mqtt.write_timeout (the client does not read)
	RefusedWebSocketOrigin                  // HTTP 403: a WebSocket handshake from a web origin not in mqtt.websocket.allowed_origins
	RefusedClientID                         // CONNACK 0x85 / 3.1.1 code 2: client id not the identity's, or another's
	RefusedSessionLimit                     // CONNACK 0x97 / 3.1.1 code 3: mqtt.max_sessions(_per_identity), every session connected
	RefusedPingRate                         // disconnected: PINGREQs faster than mqtt.ping_rate_per_client
	RefusedAuthBusy                         // CONNACK 0x89 / 3.1.1 code 3: no password check slot free (mqtt.max_password_checks)
	RefusedRetainedLimit                    // not retained (taken and routed): mqtt.max_retained(_bytes)(_per_identity)
	RefusedPendingPerAddress                // socket closed at accept: mqtt.max_pending_connects_per_address sockets from its address (IPv6: /64) have not sent CONNECT
	RefusedPendingConnects                  // socket closed at accept: mqtt.max_pending_connects sockets have not sent CONNECT
	RefusedFileLimit                        // socket closed at accept: MQTT sockets would eat into the descriptors kept for the journal, queue, state file and HTTP
	nRefusals
)

var refusalNames = [nRefusals]string{"bad_credentials", "publish_not_authorized", "subscribe_not_authorized",
	"subscription_limit", "connect_rate", "connect_timeout", "server_busy", "packet_too_large",
	"receive_maximum", "topic_alias_invalid", "malformed", "decoder_panic", "tls_handshake", "write_timeout", "websocket_origin",
	"client_id_not_allowed", "session_limit", "ping_rate", "auth_busy", "retained_limit",
	"pending_connects_per_address", "pending_connects", "file_limit"}

func (r Refusal) String() string { return refusalNames[r] }

// refusals counts refusals by reason.
type refusals [nRefusals]atomic.Int64

func (c *refusals) snapshot() map[string]int64 {
	m := make(map[string]int64, nRefusals)
	for i := range c {
		m[refusalNames[i]] = c[i].Load()
	}
	return m
}

// classify names the refusal a connection's end error stands for, if any.
func classify(err error) (Refusal, bool) {
	var code packets.Code
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, mqtt.ErrConnectionClosed):
		return 0, false
	case errors.Is(err, errPingRate):
		return 0, false // counted by the hook
	case errors.Is(err, os.ErrDeadlineExceeded):
		// mochi wraps the errors of reading CONNECT so; a deadline passed
		// later is a keep alive expiry, a normal end.
		return RefusedConnectTimeout, strings.HasPrefix(err.Error(), "read connection:")
	case errors.As(err, &code):
		switch code.Code {
		case packets.ErrBadUsernameOrPassword.Code:
			return 0, false // counted by the hook
		case packets.ErrServerBusy.Code:
			return RefusedServerBusy, true
		case packets.ErrPacketTooLarge.Code:
			return RefusedPacketTooLarge, true
		case packets.ErrReceiveMaximum.Code:
			return RefusedReceiveMaximum, true
		case packets.ErrTopicAliasInvalid.Code:
			return RefusedTopicAlias, true
		case packets.ErrConnectionRateExceeded.Code, packets.ErrNotAuthorized.Code, packets.CodeDisconnect.Code:
			return 0, false // counted where decided, or a normal end
		}
		if code.Code >= packets.ErrUnspecifiedError.Code {
			return RefusedMalformed, true
		}
	}
	return 0, false
}

// guarded wraps a mochi listener so that every connection it accepts
//
//   - must send its CONNECT within mqtt.connect_timeout (mochi itself has no
//     deadline before CONNECT, so a silent socket would be held forever);
//   - has every write bounded by mqtt.write_timeout (deadlineConn): mochi
//     writes under the client's lock with no deadline of its own (none at
//     all with keep alive 0), so a client that stops reading would hold
//     its lock, and everyone waiting on it, forever;
//   - has its end classified and counted;
//   - ends its pending time (see gate) once mochi has read its CONNECT;
//   - is known to Broker.Close, which ends it (see shutdown);
//   - cannot take the process down: a panic in mochi's packet decoders
//     (mochi-mqtt/server#501: a truncated MQTT 5 SUBSCRIBE indexes past
//     its buffer) is recovered in the connection's goroutine, which is the
//     one that reads and decodes its packets.
type guarded struct {
	listeners.Listener
	b *Broker
}

func (l *guarded) Serve(establish listeners.EstablishFn) {
	l.Listener.Serve(func(id string, c net.Conn) error {
		b := l.b
		if !b.track(c) {
			c.Close() // the broker is closing
			return nil
		}
		defer b.untrack(c)
		defer c.Close()
		b.connsOpen.Add(1)
		defer b.connsOpen.Add(-1)
		start := time.Now()
		_ = c.SetDeadline(start.Add(b.opts.ConnectTimeout))
		conn := c // what mochi was given
		defer func() {
			if r := recover(); r != nil {
				b.mqttRefused[RefusedPanic].Add(1)
				c.Close()
				b.log.Error("mqtt packet decoder panicked; connection closed", "listener", id, "remote", c.RemoteAddr(),
					"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				b.hook.forgetConn(conn)
			}
		}()
		if tc, ok := c.(*tls.Conn); ok {
			// Handshake under the connect deadline, so that a failure is
			// told apart from the MQTT that follows.
			if err := tc.Handshake(); err != nil {
				b.mqttRefused[RefusedTLSHandshake].Add(1)
				if ok, held := b.logLimiter.Allow("tls", b.now()); ok {
					b.log.Info("mqtt tls handshake failed", "listener", id, "remote", c.RemoteAddr(), "err", err, "suppressed_since_last", held)
				}
				c.Close()
				return nil
			}
		}
		dc := &deadlineConn{Conn: c, timeout: b.opts.WriteTimeout, adm: admittedOf(c)}
		conn = dc
		err := establish(id, dc)
		if r, ok := classify(err); dc.timedOut.Load() {
			b.mqttRefused[RefusedWriteTimeout].Add(1)
		} else if ok {
			b.mqttRefused[r].Add(1)
		}
		if err != nil {
			if ok, held := b.logLimiter.Allow("conn-end", b.now()); ok {
				b.log.Debug("mqtt connection ended", "listener", id, "remote", c.RemoteAddr(), "err", err, "suppressed_since_last", held)
			}
		}
		// mochi's listener would log every ended connection at warn
		// level; a flood of them is counted instead.
		return nil
	})
}

// deadlineConn sets a write deadline of timeout before every write, and
// closes the connection when one passes: the client does not read, and a
// partly written packet cannot be continued. Deadlines are never cleared:
// SetDeadline (mochi's keep alive, which clears both deadlines with keep
// alive 0) sets only the read deadline, and SetWriteDeadline is ignored.
//
// mochi first sets a deadline once it has read and accepted CONNECT
// (the keep alive's): that ends the socket's pending time (adm).
type deadlineConn struct {
	net.Conn
	timeout  time.Duration
	timedOut atomic.Bool
	adm      *admitted // the socket as the broker's acceptor admitted it; nil: another listener's
}

// NetConn returns the wrapped connection (auth.CertIdentity looks through
// to the TLS connection).
func (c *deadlineConn) NetConn() net.Conn { return c.Conn }

func (c *deadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		c.timedOut.Store(true)
		c.Conn.Close()
	}
	return n, err
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	if c.adm != nil {
		c.adm.connected()
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineConn) SetWriteDeadline(time.Time) error { return nil }
