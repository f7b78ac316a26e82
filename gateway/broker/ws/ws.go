// Package ws serves MQTT over WebSocket for the broker, with an Origin
// check (see Listener).
package ws

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// Listener serves MQTT over WebSocket (the "mqtt" subprotocol, one
// binary message per write). It replaces mochi's listeners.Websocket,
// whose upgrader accepts a handshake from any Origin and cannot be told
// otherwise: a browser lets every page it shows open a WebSocket to any
// address it can reach, so any web page opened on the LAN could connect.
// A handshake whose Origin header is not allowed gets HTTP 403 and is
// counted (websocket_origin). Clients that are not browsers send no
// Origin and are let in.
//
// The gateway's own address is not an allowed origin: it serves no web
// pages on this port, and a page that rebinds its DNS name to the
// gateway's address would look same-origin.
//
// It binds its address in Init (so Address is the real one at once, and
// an address in use is an error of New), and serves in Serve until Close.
type Listener struct {
	id, addr string
	tls      *tls.Config // nil: ws://
	cfg      Config
	origins  map[string]bool // lower-cased; "*": any
	upgrader websocket.Upgrader

	mu        sync.Mutex
	ln        net.Listener
	srv       *http.Server
	establish listeners.EstablishFn
}

var _ listeners.Listener = (*Listener)(nil)

// Config is what a Listener needs besides its id, address and TLS.
type Config struct {
	// AllowedOrigins are the web origins (scheme://host[:port]) whose
	// pages may connect; "*" allows any.
	AllowedOrigins []string
	// HandshakeTimeout bounds the HTTP request before the upgrade.
	HandshakeTimeout time.Duration
	// Refused is told of each handshake refused for its origin (the broker
	// counts and logs it).
	Refused func(origin, remote string)
	Log     *slog.Logger
	// Accept, if set, wraps the bound TCP listener (under TLS, if any):
	// the broker's acceptor retries failed accepts and admits sockets
	// within its budget, so that the HTTP server's accept loop never
	// sees an error but the listener's close.
	Accept func(net.Listener) net.Listener
}

// New returns a listener on addr (tlsConf nil: ws://).
func New(id, addr string, tlsConf *tls.Config, c Config) *Listener {
	l := &Listener{id: id, addr: addr, tls: tlsConf, cfg: c, origins: map[string]bool{}}
	for _, o := range c.AllowedOrigins {
		l.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	l.upgrader = websocket.Upgrader{Subprotocols: []string{"mqtt"}, CheckOrigin: l.checkOrigin}
	return l
}

// checkOrigin allows a handshake without an Origin header or with a
// listed one.
func (l *Listener) checkOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || l.origins["*"] || l.origins[strings.ToLower(o)] {
		return true
	}
	if l.cfg.Refused != nil {
		l.cfg.Refused(o, r.RemoteAddr)
	}
	return false
}

func (l *Listener) ID() string { return l.id }

func (l *Listener) Address() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return l.ln.Addr().String()
	}
	return l.addr
}

func (l *Listener) Protocol() string {
	if l.tls != nil {
		return "wss"
	}
	return "ws"
}

// Init binds the address.
func (l *Listener) Init(log *slog.Logger) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return err
	}
	if l.cfg.Accept != nil {
		ln = l.cfg.Accept(ln)
	}
	if l.tls != nil {
		ln = tls.NewListener(ln, l.tls)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ln = ln
	l.srv = &http.Server{
		Handler: http.HandlerFunc(l.handle),
		// Until the upgrade; then the connection guard's deadlines rule.
		ReadHeaderTimeout: l.cfg.HandshakeTimeout,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return nil
}

// handle upgrades a handshake and runs the MQTT connection in the
// request's goroutine (the HTTP server owns it) until it ends.
func (l *Listener) handle(w http.ResponseWriter, r *http.Request) {
	c, err := l.upgrader.Upgrade(w, r, nil) // answers a refusal itself
	if err != nil {
		return
	}
	defer c.Close()
	l.mu.Lock()
	establish := l.establish
	l.mu.Unlock()
	_ = establish(l.id, &wsConn{Conn: c.NetConn(), c: c}) // the guard counts and logs the end
}

// Serve serves connections until Close.
func (l *Listener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	l.establish = establish
	srv, ln := l.srv, l.ln
	l.mu.Unlock()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		l.cfg.Log.Error("websocket listener stopped", "listener", l.id, "err", err)
	}
}

// Close stops accepting and waits up to 5 s for the handshakes under way.
// It does not end the MQTT connections (closeClients is not called:
// mochi's closeListenerClients can deadlock, see broker.Broker.Close),
// whose handlers the HTTP server does not wait for: their owner, the
// broker, ends them.
func (l *Listener) Close(listeners.CloseFn) {
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// wsConn is a WebSocket connection as the net.Conn mochi reads MQTT from:
// Read concatenates binary messages, Write sends one message.
//
// Deadlines are the underlying connection's, but each gorilla write sets
// that connection's write deadline to gorilla's own (none unless told), so
// one set by mochi or the PUBACK writer would be cleared by the next
// write and a client that stops reading would hold its writer forever.
// The write deadline is therefore kept here and handed to gorilla before
// each write. (mochi's reader sets deadlines while others write, so it is
// atomic.)
type wsConn struct {
	net.Conn
	c *websocket.Conn
	r io.Reader // the message being read, if any

	wmu           sync.Mutex   // one writer at a time, as gorilla requires
	writeDeadline atomic.Int64 // Unix nanoseconds; 0: none
}

var errNotBinary = errors.New("websocket message is not binary")

// NetConn returns the connection under the WebSocket (a *tls.Conn on
// wss://), whose client certificate names the client.
func (ws *wsConn) NetConn() net.Conn { return ws.Conn }

func (ws *wsConn) Read(p []byte) (int, error) {
	for {
		if ws.r == nil {
			op, r, err := ws.c.NextReader()
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				return 0, errNotBinary // [MQTT-6.0.0-1]
			}
			ws.r = r
		}
		n, err := ws.r.Read(p)
		if errors.Is(err, io.EOF) {
			ws.r = nil
			err = nil
			if n == 0 {
				continue // an empty message, or the end of one
			}
		}
		if err != nil {
			return n, fmt.Errorf("read websocket: %w", err)
		}
		return n, nil
	}
}

func (ws *wsConn) setWriteDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	ws.writeDeadline.Store(ns)
}

func (ws *wsConn) SetDeadline(t time.Time) error {
	ws.setWriteDeadline(t)
	return ws.Conn.SetDeadline(t)
}

func (ws *wsConn) SetWriteDeadline(t time.Time) error {
	ws.setWriteDeadline(t)
	return ws.Conn.SetWriteDeadline(t)
}

func (ws *wsConn) Write(p []byte) (int, error) {
	ws.wmu.Lock()
	defer ws.wmu.Unlock()
	var t time.Time
	if ns := ws.writeDeadline.Load(); ns != 0 {
		t = time.Unix(0, ns)
	}
	_ = ws.c.SetWriteDeadline(t)
	if err := ws.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
