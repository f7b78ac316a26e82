package kafka

import (
	"net"
	"sync/atomic"
	"time"
)

// meteredDialer dials the brokers for one producer and counts every byte
// its connections move, so that a stall is "no bytes moved", not "no
// batch finished": on a slow link a large request takes long, and that is
// progress as long as its bytes go out.
type meteredDialer struct {
	d     net.Dialer
	moved *atomic.Int64
}

func newMeteredDialer(timeout, keepAlive time.Duration) *meteredDialer {
	return &meteredDialer{d: net.Dialer{Timeout: timeout, KeepAlive: keepAlive}, moved: new(atomic.Int64)}
}

func (m *meteredDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := m.d.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	return &meteredConn{Conn: c, moved: m.moved}, nil
}

// meteredConn counts the bytes read and written. A write is passed on in
// chunks, so that a request larger than the socket's buffer shows progress
// as the link takes it (each chunk returns once the kernel has room, that
// is once the peer has acknowledged earlier bytes).
type meteredConn struct {
	net.Conn
	moved *atomic.Int64
}

const meterChunk = 16 << 10

func (c *meteredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.moved.Add(int64(n))
	return n, err
}

func (c *meteredConn) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := c.Conn.Write(b[done:min(len(b), done+meterChunk)])
		done += n
		c.moved.Add(int64(n))
		if err != nil {
			return done, err
		}
	}
	return done, nil
}
