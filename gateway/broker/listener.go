package broker

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The broker's own accept path. mochi's TCP listener returns from its
// accept loop at the first error (an EMFILE is enough) and nothing starts
// it again: the process would look healthy and take no device until a
// restart. Its Close also ends the listener's clients through
// Server.closeListenerClients, whose Clients.GetByListener takes the
// clients' read lock twice and deadlocks against a disconnecting
// client's Clients.Delete (mochi v2.7.9). So the broker serves TCP and
// TLS with tcpListener, and every listener (WebSocket too) accepts
// through an acceptor, which
//
//   - retries a failed accept with a capped backoff (5 ms doubling to
//     1 s, as net/http's Server does) and returns only once closed,
//     recording how long it has failed for readiness (ListenerStatus);
//   - admits a socket only within the sockets budget: at most
//     mqtt.max_pending_connects sockets that have not sent CONNECT yet,
//     mqtt.max_pending_connects_per_address of them from one address
//     (IPv6: one /64; mqtt.connect_rate_exempt's prefixes aside), and no
//     more sockets in all than the process's
//     descriptor limit less fileReserve. A refused socket is closed at
//     once and counted.

const (
	// acceptBackoffMin and acceptBackoffMax bound the wait after a failed
	// accept (net/http's Server waits the same).
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second

	// stalledAfter is how long a listener may fail to accept before it
	// is reported not accepting (and readiness fails): a burst of
	// ECONNABORTED is not worth a restart, a listener that cannot accept
	// for seconds is.
	stalledAfter = 3 * time.Second

	// fileReserve is the descriptors the broker leaves to the rest of the
	// process: the journal (the segment written, the one it rolls to,
	// its directory for fsync), the outbound queue (writer, reader,
	// metadata, directory), the state file (bbolt and the previous
	// checkpoint beside it), the data-dir lock, the hold directory, the
	// Kafka connections (a few per broker), the HTTP endpoint's listener
	// and its clients (status page, scrapes), the I²C bus, /proc reads
	// and the log. Some twenty are used at once in normal running; the
	// rest is margin for HTTP clients and Kafka reconnects overlapping
	// old connections, so that a segment roll never fails because MQTT
	// took every descriptor.
	fileReserve = 256

	// minSockets is the fewest MQTT sockets the broker allows, whatever
	// the file limit says: a limit too low for it is the operator's to
	// raise (LimitNOFILE in the systemd unit).
	minSockets = 16
)

// fileLimit returns the process's descriptor limit (RLIMIT_NOFILE, soft;
// Go raises it to the hard limit at start), or 0 if it cannot be read
// or is unlimited (or as good as: over 2³⁰).
func fileLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 0
	}
	return int(l.Cur)
}

// socketBudget is what the broker's listeners may hold.
type socketBudget struct {
	maxSockets  int // MQTT sockets open, CONNECT sent or not; 0: no limit
	maxPending  int // sockets that have not sent CONNECT; 0: no limit
	maxPerAddr  int // ... from one address (IPv6: /64); 0: no limit
	fileLimit   int // RLIMIT_NOFILE at Listen; 0: unknown or none
	lowered     bool
	configured  int // maxPending as configured, before the file limit lowered it
	configSocks int // MaxClients + MaxPending
}

// newSocketBudget works out the budget from the options and the file
// limit: every MQTT socket within the limit less fileReserve, and the
// pending ones within half of that, so that clients that send CONNECT
// always find room.
func newSocketBudget(o Options, limit int) socketBudget {
	s := socketBudget{maxPending: o.MaxPendingConnects, maxPerAddr: o.MaxPendingConnectsPerAddress, fileLimit: limit,
		configured: o.MaxPendingConnects, configSocks: o.MaxClients + o.MaxPendingConnects}
	if limit > 0 {
		s.maxSockets = max(limit-fileReserve, minSockets)
		if s.maxPending == 0 || s.maxPending > s.maxSockets/2 {
			s.maxPending, s.lowered = max(s.maxSockets/2, 1), true
		}
	}
	if s.maxPending > 0 && (s.maxPerAddr == 0 || s.maxPerAddr > s.maxPending) {
		s.maxPerAddr = s.maxPending
	}
	return s
}

// gate admits sockets within the budget and counts them until they send
// CONNECT (pending) and until they close (open).
type gate struct {
	b      *Broker
	budget socketBudget
	// exempt are mqtt.connect_rate_exempt's prefixes (local services,
	// the simulator), not held to the per-address bound; the total and
	// the file limit still hold them.
	exempt []netip.Prefix

	mu      sync.Mutex
	open    int
	pending int
	byAddr  map[netip.Prefix]int // pending sockets by source (IPv4 address, IPv6 /64)
}

func newGate(b *Broker, budget socketBudget, exempt []string) *gate {
	g := &gate{b: b, budget: budget, byAddr: map[netip.Prefix]int{}}
	for _, e := range exempt {
		if p, err := netip.ParsePrefix(e); err == nil { // validated by configs
			g.exempt = append(g.exempt, p)
		}
	}
	return g
}

// perAddress reports whether src is held to the per-address bound.
func (g *gate) perAddress(src netip.Prefix) bool {
	for _, p := range g.exempt {
		if p.Overlaps(src) && p.Bits() <= src.Bits() {
			return false
		}
	}
	return true
}

// source is the prefix a remote address's pending sockets are counted
// under: an IPv4 address, or an IPv6 /64 (one host's, or one LAN's,
// addresses: privacy addresses make a new one at will).
func source(a net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.Prefix(64)
	return p
}

// admit takes a place for a socket just accepted, or names the reason it
// is refused.
func (g *gate) admit(src netip.Prefix) (Refusal, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.budget.maxSockets > 0 && g.open >= g.budget.maxSockets:
		return RefusedFileLimit, false
	case g.budget.maxPending > 0 && g.pending >= g.budget.maxPending:
		return RefusedPendingConnects, false
	case g.budget.maxPerAddr > 0 && g.byAddr[src] >= g.budget.maxPerAddr && g.perAddress(src):
		return RefusedPendingPerAddress, false
	}
	g.open++
	g.pending++
	g.byAddr[src]++
	return 0, true
}

// connected ends a socket's pending time.
func (g *gate) connected(src netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending--
	if g.byAddr[src]--; g.byAddr[src] <= 0 {
		delete(g.byAddr, src)
	}
}

// closed frees a socket's place.
func (g *gate) closed() {
	g.mu.Lock()
	g.open--
	g.mu.Unlock()
}

// counts returns the sockets open and pending.
func (g *gate) counts() (open, pending int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.pending
}

// admitted is a socket the gate let in: it holds its pending place until
// CONNECT is read (mochi then sets the keep-alive deadline: see
// deadlineConn.SetDeadline) or it closes, and its open place until it
// closes.
type admitted struct {
	net.Conn
	g         *gate
	src       netip.Prefix
	pending   sync.Once
	closeOnce sync.Once
}

// NetConn returns the accepted connection.
func (c *admitted) NetConn() net.Conn { return c.Conn }

// connected ends the pending time (once).
func (c *admitted) connected() { c.pending.Do(func() { c.g.connected(c.src) }) }

func (c *admitted) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.connected()
		c.g.closed()
	})
	return err
}

// admittedOf finds the admitted socket under a connection (through TLS
// and WebSocket wrappers), if any.
func admittedOf(c net.Conn) *admitted {
	for c != nil {
		if a, ok := c.(*admitted); ok {
			return a
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// acceptHealth is a listener's accept state, for readiness.
type acceptHealth struct {
	id           string
	failingSince atomic.Int64 // Unix nanoseconds of the first failure in a row; 0: accepting
	errors       atomic.Uint64
	lastErr      atomic.Pointer[string]
	stopped      atomic.Bool // its accept loop ended without Close
}

// ListenerStatus is whether one of the broker's listeners accepts.
type ListenerStatus struct {
	ID      string // tcp, tls, ws
	Address string
	// Accepting is false when the listener's accepts have failed for
	// over a few seconds (stalledAfter), or its accept loop has ended.
	Accepting bool
	// FailingFor is how long its accepts have failed in a row.
	FailingFor   time.Duration
	AcceptErrors uint64 // failed accepts since start
	LastError    string // the last failed accept's error, if any
}

func (h *acceptHealth) status(addr string, now time.Time) ListenerStatus {
	s := ListenerStatus{ID: h.id, Address: addr, Accepting: !h.stopped.Load(), AcceptErrors: h.errors.Load()}
	if e := h.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	if since := h.failingSince.Load(); since != 0 {
		s.FailingFor = now.Sub(time.Unix(0, since))
		if s.FailingFor > stalledAfter {
			s.Accepting = false
		}
	}
	return s
}

// acceptor is a net.Listener whose Accept retries failed accepts with a
// capped backoff and admits only what the gate allows; it returns an
// error only once closed (net.ErrClosed).
type acceptor struct {
	net.Listener
	b      *Broker
	g      *gate
	health *acceptHealth

	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

func newAcceptor(ln net.Listener, b *Broker, g *gate, h *acceptHealth) *acceptor {
	return &acceptor{Listener: ln, b: b, g: g, health: h, done: make(chan struct{})}
}

func (a *acceptor) Close() error {
	a.closeOnce.Do(func() { close(a.done) })
	return a.Listener.Close()
}

func (a *acceptor) closing() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func (a *acceptor) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := a.Listener.Accept()
		if err != nil {
			if a.closing() || errors.Is(err, net.ErrClosed) {
				return nil, net.ErrClosed
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			a.failed(err, delay)
			t := time.NewTimer(delay)
			select {
			case <-a.done:
				t.Stop()
				return nil, net.ErrClosed
			case <-t.C:
			}
			continue
		}
		delay = 0
		a.health.failingSince.Store(0)
		src := source(c.RemoteAddr())
		if r, ok := a.g.admit(src); !ok {
			c.Close()
			a.b.mqttRefused[r].Add(1)
			if ok, held := a.b.logLimiter.Allow("admit", a.b.now()); ok {
				a.b.log.Warn("mqtt socket refused at accept", "listener", a.health.id, "remote", c.RemoteAddr(), "reason", r.String(),
					"suppressed_since_last", held)
			}
			continue
		}
		return &admitted{Conn: c, g: a.g, src: src}, nil
	}
}

// failed records a failed accept.
func (a *acceptor) failed(err error, delay time.Duration) {
	h := a.health
	h.errors.Add(1)
	msg := err.Error()
	h.lastErr.Store(&msg)
	h.failingSince.CompareAndSwap(0, time.Now().UnixNano())
	if ok, held := a.b.logLimiter.Allow("accept-"+h.id, a.b.now()); ok {
		a.b.log.Error("mqtt accept failed; retrying", "listener", h.id, "err", err, "retry_in", delay, "suppressed_since_last", held)
	}
}

// tcpListener is the broker's MQTT over TCP or TLS listener (mochi's
// listeners.Listener). It binds in Init, serves until Close through an
// acceptor, and runs each connection in its own goroutine. Its Close
// stops accepting and waits for the accept loop, and leaves the clients
// to the Broker (see Broker.Close): it never calls mochi's
// closeListenerClients.
type tcpListener struct {
	id, addr string
	tls      *tls.Config // nil: plain TCP
	b        *Broker
	health   *acceptHealth
	// listen binds the address (net.Listen; tests wrap what it returns).
	listen func(network, addr string) (net.Listener, error)

	mu     sync.Mutex
	ln     *acceptor
	served chan struct{} // closed when Serve returns
}

var _ listeners.Listener = (*tcpListener)(nil)

func newTCPListener(b *Broker, id, addr string, tlsConf *tls.Config) *tcpListener {
	listen := b.listen
	if listen == nil {
		listen = net.Listen
	}
	return &tcpListener{id: id, addr: addr, tls: tlsConf, b: b, health: &acceptHealth{id: id}, listen: listen,
		served: make(chan struct{})}
}

func (l *tcpListener) ID() string { return l.id }

func (l *tcpListener) Address() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return l.ln.Addr().String()
	}
	return l.addr
}

func (l *tcpListener) Protocol() string {
	if l.tls != nil {
		return "tls"
	}
	return "tcp"
}

// Init binds the address.
func (l *tcpListener) Init(*slog.Logger) error {
	ln, err := l.listen("tcp", l.addr)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ln = newAcceptor(ln, l.b, l.b.gate, l.health)
	return nil
}

// Serve accepts connections until Close and hands each to establish in
// its own goroutine (the guard counts and logs its end).
func (l *tcpListener) Serve(establish listeners.EstablishFn) {
	defer close(l.served)
	l.mu.Lock()
	ln := l.ln
	l.mu.Unlock()
	var tl net.Listener = ln
	if l.tls != nil {
		// The handshake is the guard's, under the connect deadline.
		tl = tls.NewListener(ln, l.tls)
	}
	for {
		c, err := tl.Accept()
		if err != nil {
			if !ln.closing() {
				l.health.stopped.Store(true) // not expected: the acceptor returns only once closed
				l.b.log.Error("mqtt listener stopped", "listener", l.id, "err", err)
			}
			return
		}
		go func() { _ = establish(l.id, c) }()
	}
}

// Close stops accepting and waits for Serve to return, if it was
// started. It does not end the clients (closeClients is not called):
// Broker.Close has done so.
func (l *tcpListener) Close(listeners.CloseFn) {
	l.mu.Lock()
	ln := l.ln
	l.mu.Unlock()
	if ln == nil {
		return
	}
	ln.Close()
	if l.b.serving.Load() {
		<-l.served
	}
}

// gateBudget returns the socket budget (zero before Listen).
func (b *Broker) gateBudget() socketBudget {
	if b.gate == nil {
		return socketBudget{}
	}
	return b.gate.budget
}

// Listeners reports whether each listener accepts connections (readiness
// fails when one does not).
func (b *Broker) Listeners() []ListenerStatus {
	now := time.Now()
	var s []ListenerStatus
	for _, l := range b.listeners {
		if h := b.health[l.ID()]; h != nil {
			s = append(s, h.status(l.Address(), now))
		}
	}
	return s
}

// track records a connection the guard runs, unless the broker is
// closing.
func (b *Broker) track(c net.Conn) bool {
	b.connMu.Lock()
	defer b.connMu.Unlock()
	if b.stopping {
		return false
	}
	b.conns[c] = struct{}{}
	b.connWG.Add(1)
	return true
}

func (b *Broker) untrack(c net.Conn) {
	b.connMu.Lock()
	delete(b.conns, c)
	b.connMu.Unlock()
	b.connWG.Done()
}

// shutdown ends every connection before mochi's Server.Close, so that
// Close finds no client to end: mochi's closeListenerClients calls
// Clients.GetByListener, which takes the clients' read lock twice (the
// second time in Len) and so deadlocks when a disconnecting client's
// Clients.Delete asks for the write lock in between (mochi v2.7.9).
// Our listeners never call it (see tcpListener.Close and ws.Listener.Close),
// and by then no connection is left anyway. In order:
//
//  1. the listeners stop accepting (a connection accepted meanwhile is
//     closed by the guard: stopping);
//  2. the clients connected then get DISCONNECT 0x8B (server shutting
//     down, MQTT 5) and their sockets are closed, all at once: a client
//     that does not read holds up only its own write, for at most
//     mqtt.write_timeout. The snapshot is Clients.GetAll, which takes the
//     read lock once;
//  3. sockets still open (no CONNECT yet, or connected after the
//     snapshot) are closed;
//  4. it waits for every connection's goroutine to end (mochi's
//     OnDisconnect and the session's end included).
func (b *Broker) shutdown() {
	b.connMu.Lock()
	if b.stopping {
		b.connMu.Unlock()
		return
	}
	b.stopping = true
	b.connMu.Unlock()
	for _, l := range b.listeners {
		l.Close(func(string) {})
	}
	var wg sync.WaitGroup
	for _, cl := range b.server.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() {
			continue
		}
		wg.Go(func() { _ = b.server.DisconnectClient(cl, packets.ErrServerShuttingDown) })
	}
	wg.Wait()
	b.connMu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.connMu.Unlock()
	b.connWG.Wait()
}
