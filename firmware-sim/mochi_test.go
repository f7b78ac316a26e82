package firmwaresim_test

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// mochiBroker is a plain mochi broker on a loopback port for the
// simulated devices, with a shutdown that cannot hang. mochi v2.7.9's
// Server.Close ends each listener's clients through
// Clients.GetByListener, which takes the clients' read lock twice and
// deadlocks when a disconnecting client's Clients.Delete waits for the
// write lock in between (TestMQTT311Device hung so for 10 minutes). Its
// listener (loopListener) therefore never asks mochi to close its
// clients: Close stops accepting, disconnects the clients itself, waits
// for their connections to end, and only then calls Server.Close, which
// finds nobody left.
type mochiBroker struct {
	srv  *mqtt.Server
	ln   *loopListener
	once sync.Once
}

// startMochi serves a mochi broker with hook h on a loopback port until
// Close (or the test's end).
func startMochi(t *testing.T, h mqtt.Hook, inline bool) *mochiBroker {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), InlineClient: inline})
	if h != nil {
		if err := srv.AddHook(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	ln := &loopListener{conns: map[net.Conn]struct{}{}}
	if err := srv.AddListener(ln); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	b := &mochiBroker{srv: srv, ln: ln}
	t.Cleanup(b.Close)
	return b
}

// Addr is the broker's address.
func (b *mochiBroker) Addr() string { return b.ln.Address() }

// Close stops accepting, disconnects every client (a snapshot taken
// with Clients.GetAll, one read lock), closes what is still open, waits
// for the connections to end, then closes the server.
func (b *mochiBroker) Close() {
	b.once.Do(func() {
		b.ln.stop()
		var wg sync.WaitGroup
		for _, cl := range b.srv.Clients.GetAll() {
			if cl.Net.Inline || cl.Closed() {
				continue
			}
			wg.Go(func() { _ = b.srv.DisconnectClient(cl, packets.ErrServerShuttingDown) })
		}
		wg.Wait()
		b.ln.closeConns()
		b.srv.Close()
	})
}

// loopListener is a TCP listener on 127.0.0.1 (mochi's listeners.Listener)
// whose Close does not call closeClients.
type loopListener struct {
	ln net.Listener

	mu      sync.Mutex
	closed  bool
	conns   map[net.Conn]struct{}
	running sync.WaitGroup // the connections' goroutines
	served  sync.WaitGroup // Serve
}

var _ listeners.Listener = (*loopListener)(nil)

func (l *loopListener) ID() string       { return "t" }
func (l *loopListener) Protocol() string { return "tcp" }
func (l *loopListener) Address() string  { return l.ln.Addr().String() }

func (l *loopListener) Init(*slog.Logger) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	l.ln = ln
	l.served.Add(1) // Serve follows (mochi's Server.Serve)
	return err
}

func (l *loopListener) Serve(establish listeners.EstablishFn) {
	defer l.served.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.conns[c] = struct{}{}
		l.running.Add(1)
		l.mu.Unlock()
		go func() {
			defer l.running.Done()
			_ = establish(l.ID(), c)
			c.Close()
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
		}()
	}
}

// stop stops accepting and waits for Serve to return.
func (l *loopListener) stop() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.ln.Close()
	l.served.Wait()
}

// closeConns closes the connections still open and waits for their
// goroutines to end.
func (l *loopListener) closeConns() {
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.running.Wait()
}

// Close stops accepting; the clients are mochiBroker.Close's to end.
func (l *loopListener) Close(listeners.CloseFn) { l.stop() }
