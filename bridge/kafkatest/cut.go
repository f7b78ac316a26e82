package kafkatest

import (
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Link is the network between clients and a kfake broker, which a test can
// cut and restore. It sits in kfake's own listener, so the address the
// broker advertises in metadata goes through it too.
type Link struct {
	mu        sync.Mutex
	down      bool
	cutOnSend bool // cut instead of sending the next response
	conns     map[net.Conn]bool
}

// Cut closes every open connection and refuses new ones until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
	for c := range l.conns {
		c.Close()
	}
	clear(l.conns)
}

// CutAfterCommit arranges that the next transaction commit (EndTxn with
// commit set) is applied by the broker but its response is never sent: the
// link is cut instead, as if it failed right after the commit left the
// gateway. The producer sees an unknown outcome. Down reports when it
// happened; Restore as usual.
func (l *Link) CutAfterCommit(c *kfake.Cluster) {
	c.ControlKey(kmsg.EndTxn.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if r, ok := req.(*kmsg.EndTxnRequest); !ok || !r.Commit {
			return nil, nil, false // not handled: kept for the next request
		}
		c.DropControl() // once
		l.mu.Lock()
		l.cutOnSend = true
		l.mu.Unlock()
		return nil, nil, false // kfake commits as usual
	})
}

// Down reports whether the link is cut.
func (l *Link) Down() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.down
}

// Restore lets connections through again.
func (l *Link) Restore() {
	l.mu.Lock()
	l.down = false
	l.mu.Unlock()
}

type cutListener struct {
	net.Listener
	link *Link
}

func (c *cutListener) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c.link.mu.Lock()
		if c.link.down {
			c.link.mu.Unlock()
			conn.Close()
			continue
		}
		c.link.conns[conn] = true
		c.link.mu.Unlock()
		return &cutConn{Conn: conn, link: c.link}, nil
	}
}

// cutConn cuts the link instead of writing when the link says so.
type cutConn struct {
	net.Conn
	link *Link
}

func (c *cutConn) Write(b []byte) (int, error) {
	c.link.mu.Lock()
	cut := c.link.cutOnSend
	c.link.cutOnSend = false
	c.link.mu.Unlock()
	if cut {
		c.link.Cut()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

// StartWithLink is Start with a Link that can cut the broker off.
func StartWithLink(t testing.TB, partitions int32, topics ...string) (*Link, *kfake.Cluster, []string) {
	t.Helper()
	link := &Link{conns: map[net.Conn]bool{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return &cutListener{Listener: ln, link: link}, nil
		}))
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	CreateTopics(t, c, partitions, topics...)
	return link, c, c.ListenAddrs()
}
