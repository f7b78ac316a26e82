package broker

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestDeadlineConn: every write has the deadline, whatever mochi does with
// SetDeadline (keep alive 0 clears both) or SetWriteDeadline; a write that
// passes it closes the connection and marks it.
func TestDeadlineConn(t *testing.T) {
	a, b := net.Pipe() // unbuffered: a write waits for a read
	defer b.Close()
	// The first write waits for the reader goroutine, which a loaded
	// machine may start late: its deadline is far off. The second one's
	// is near; nobody reads it.
	c := &deadlineConn{Conn: a, timeout: time.Minute}
	c.SetDeadline(time.Time{})      // as mochi does with keep alive 0
	c.SetWriteDeadline(time.Time{}) // ignored
	go func() {
		buf := make([]byte, 4)
		b.Read(buf) // the first write is taken, then nothing is read
	}()
	if _, err := c.Write([]byte{0xd0, 0, 0xd0, 0}); err != nil {
		t.Fatalf("first write, read by the peer: %v", err)
	}
	if c.timedOut.Load() {
		t.Fatal("timed out after a write that was read")
	}
	c.timeout = 50 * time.Millisecond
	c.SetDeadline(time.Time{})
	c.SetWriteDeadline(time.Time{})
	_, err := c.Write([]byte{0xd0, 0})
	if !errors.Is(err, os.ErrDeadlineExceeded) || !c.timedOut.Load() {
		t.Fatalf("write nobody reads: %v, timed out %v; want a deadline error, marked", err, c.timedOut.Load())
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("after the timeout the connection should be closed, read: %v", err)
	}
}
