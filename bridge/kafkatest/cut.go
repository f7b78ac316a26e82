package kafkatest

import (
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Link is the network between clients and a kfake broker, which a test can
// cut and restore. It sits in kfake's own listener, so the address the
// broker advertises in metadata goes through it too.
type Link struct {
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
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
		return conn, nil
	}
}

// StartWithLink is Start with a Link that can cut the broker off.
func StartWithLink(t testing.TB, partitions int32, topics ...string) (*Link, *kfake.Cluster, []string) {
	t.Helper()
	link := &Link{conns: map[net.Conn]bool{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...),
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
	return link, c, c.ListenAddrs()
}
