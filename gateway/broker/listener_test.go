package broker

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// listenerOptions is connect_test's testOptions with anonymous clients
// and the default pending-connect bounds.
func listenerOptions(t *testing.T) Options {
	o := testOptions(t, nil)
	o.AllowAnonymous = true
	o.MaxPendingConnects, o.MaxPendingConnectsPerAddress = 1024, 32 // mqtt.max_pending_connects(_per_address)'s defaults
	return o
}

// connect311 sends an MQTT 3.1.1 CONNECT (clean session) on c and reads
// the CONNACK's return code, waiting at most patience.
func connect311(c net.Conn, id string) (byte, error) { return connect311Within(c, id, patience) }

// connect311Within is connect311 waiting at most d.
func connect311Within(c net.Conn, id string, d time.Duration) (byte, error) {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, byte(len(id) >> 8), byte(len(id))}
	body = append(body, id...)
	pk := append([]byte{0x10, byte(len(body))}, body...)
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(pk); err != nil {
		return 0, fmt.Errorf("write CONNECT: %w", err)
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(c, ack); err != nil {
		return 0, fmt.Errorf("read CONNACK: %w", err)
	}
	if ack[0] != 0x20 {
		return 0, fmt.Errorf("got %#x, want CONNACK", ack[0])
	}
	return ack[3], nil
}

// dialFrom dials addr from the local address from (a loopback address).
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: patience}
	return d.Dial("tcp", addr)
}

// goodDevice connects a device from the address from and reports
// whether it got CONNACK 0.
func goodDevice(t *testing.T, from, addr, id string) error {
	t.Helper()
	c, err := dialFrom(from, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	code, err := connect311(c, id)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("CONNACK code %d", code)
	}
	return nil
}

// closedSoon reports whether the peer closed c within d.
func closedSoon(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !os.IsTimeout(err)
}

// TestListenerSurvivesFileLimit: with the process out of descriptors an
// accept fails (EMFILE); once descriptors are free again, devices connect
// (mochi's own TCP listener stops accepting for good at the first error).
func TestListenerSurvivesFileLimit(t *testing.T) {
	b := startBroker(t, listenerOptions(t), nil)
	addr := b.Addr()
	if err := goodDevice(t, "127.0.0.1", addr, "before"); err != nil {
		t.Fatalf("a device before the file limit: %v", err)
	}

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Fill the descriptor table up to a lowered limit, as the rest of
	// the process might, leaving none for the next accept.
	low := lim
	low.Cur = uint64(openFiles(t)) + 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("lower RLIMIT_NOFILE: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	var held []*os.File
	release := func() {
		for _, f := range held {
			f.Close()
		}
		held = nil
	}
	defer release()
	// The client's socket is made before the table is full (the client
	// is this process too) and connects once it is.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	// The kernel completes the connection; each accept of it fails
	// (EMFILE) while the table is full.
	time.Sleep(200 * time.Millisecond)
	release()
	restore()
	f := os.NewFile(uintptr(fd), "client")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if code, err := connect311(c, "queued"); err != nil || code != 0 {
		t.Errorf("the device queued while the descriptors ran out: code %d, %v", code, err)
	}
	if err := goodDevice(t, "127.0.0.1", addr, "after"); err != nil {
		t.Errorf("a device after the descriptors were freed: %v", err)
	}
}

// failingListener fails its accepts with EMFILE while failing is set.
type failingListener struct {
	net.Listener
	failing atomic.Bool
	failed  atomic.Int64
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.failing.Load() {
		l.failed.Add(1)
		time.Sleep(time.Millisecond) // as a real EMFILE: the queued connection stays queued
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsReported: a listener whose accepts keep failing is
// retried with a backoff, reported not accepting after a few seconds
// (readiness), and accepts again once they succeed.
func TestAcceptErrorsReported(t *testing.T) {
	var fl *failingListener
	listen := func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return nil, err
		}
		fl = &failingListener{Listener: ln}
		fl.failing.Store(true)
		return fl, nil
	}
	b := startBroker(t, listenerOptions(t), func(b *Broker) { b.listen = listen })
	c, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(patience)
	var st ListenerStatus
	for {
		st = b.Stats().Listeners[0]
		if !st.Accepting || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Accepting || st.FailingFor < stalledAfter || st.LastError == "" {
		t.Fatalf("accepts failing for %v: %+v; want not accepting after %v, with the error", st.FailingFor, st, stalledAfter)
	}
	// Backoff: 5 ms doubling to 1 s is some 12 attempts in the first 3 s.
	if n := fl.failed.Load(); n > 20 {
		t.Errorf("%d accepts in %v: not backing off", n, st.FailingFor)
	}
	fl.failing.Store(false)
	if code, err := connect311(c, "queued"); err != nil || code != 0 {
		t.Fatalf("the device queued while accepts failed: code %d, %v", code, err)
	}
	if st := b.Stats().Listeners[0]; !st.Accepting || st.FailingFor != 0 || st.AcceptErrors == 0 {
		t.Errorf("after a successful accept: %+v; want accepting, the errors counted", st)
	}
}

// openFiles counts this process's open descriptors.
func openFiles(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("count open files: %v", err)
	}
	return len(ents)
}

// TestPendingConnectsPerAddress: sockets that send no CONNECT beyond
// mqtt.max_pending_connects_per_address (default) from one address are
// closed at once and counted, and a device from another address
// connects meanwhile.
func TestPendingConnectsPerAddress(t *testing.T) {
	b := startBroker(t, listenerOptions(t), nil)
	addr := b.Addr()
	const extra = 8
	n := listenerOptions(t).MaxPendingConnectsPerAddress + extra
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := dialFrom("127.0.0.1", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	closed := 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, c := range conns {
		wg.Go(func() {
			if closedSoon(c, 2*time.Second) {
				mu.Lock()
				closed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if closed != extra {
		t.Errorf("%d idle sockets from one address: %d closed before the connect timeout, want %d", n, closed, extra)
	}
	if got := b.Stats().Refused["pending_connects_per_address"]; got != extra {
		t.Errorf("pending_connects_per_address refusals: %d, want %d", got, extra)
	}
	if err := goodDevice(t, "127.0.0.2", addr, "other"); err != nil {
		t.Errorf("a device from another address: %v", err)
	}
}

// TestCloseWhileClientsComeAndGo: Close returns while clients connect
// and disconnect. mochi v2.7.9's Server.Close takes the clients' read
// lock twice (Clients.GetByListener) and deadlocks when a disconnecting
// client's Clients.Delete waits for the write lock in between. Real
// clients come and go, and, since the window between the two read locks
// is a few instructions wide, a goroutine deletes clean sessions as
// mochi does at each disconnect, as often as the machine allows.
func TestCloseWhileClientsComeAndGo(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 10
	}
	var total int64
	for round := range rounds {
		b := startBroker(t, listenerOptions(t), nil)
		addr := b.Addr()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var connected atomic.Int64
		for w := range 16 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("tcp", addr)
					if err != nil {
						return // closed
					}
					// mochi's listener leaves a socket it accepts while
					// closing open and unanswered: wait little.
					if code, err := connect311Within(c, fmt.Sprintf("churn-%d-%d", w, i), time.Second); err == nil && code == 0 {
						connected.Add(1)
						c.Write([]byte{0xe0, 0}) // DISCONNECT: mochi deletes the clean session
					}
					c.Close()
				}
			})
		}
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b.server.Clients.Delete(fmt.Sprintf("gone-%d", i))
			}
		})
		for connected.Load() < 50 {
			time.Sleep(time.Millisecond)
		}
		done := make(chan error, 1)
		go func() { done <- b.Close() }()
		select {
		case <-done:
		case <-time.After(patience):
			t.Fatalf("round %d: Close hung with clients coming and going (%d connected):\n%s", round, connected.Load(), closeStacks())
		}
		close(stop)
		wg.Wait()
		total += connected.Load()
	}
	t.Logf("%d rounds, %d connections", rounds, total)
}

// closeStacks returns the stacks of the goroutines in mochi's
// Server.Close.
func closeStacks() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "(*Server).Close") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestSocketBudget: the file limit less the reserve bounds the MQTT
// sockets, and the pending ones to half of that.
func TestSocketBudget(t *testing.T) {
	o := listenerOptions(t) // 1024 pending, 32 per address
	for name, tc := range map[string]struct {
		limit                     int
		sockets, pending, perAddr int
		lowered                   bool
	}{
		"no limit known":   {0, 0, 1024, 32, false},
		"systemd's 524288": {524288, 524288 - fileReserve, 1024, 32, false},
		"1024":             {1024, 1024 - fileReserve, (1024 - fileReserve) / 2, 32, true},
		"tiny":             {100, minSockets, minSockets / 2, minSockets / 2, true},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSocketBudget(o, tc.limit)
			if s.maxSockets != tc.sockets || s.maxPending != tc.pending || s.maxPerAddr != tc.perAddr || s.lowered != tc.lowered {
				t.Errorf("budget %+v; want sockets %d, pending %d, per address %d, lowered %v", s, tc.sockets, tc.pending, tc.perAddr, tc.lowered)
			}
		})
	}
}

// TestGate: sockets are refused beyond each bound, an IPv6 /64 counts as
// one address, an exempt address is held to the total only, and a place
// is given back at CONNECT or close.
func TestGate(t *testing.T) {
	b := &Broker{}
	g := newGate(b, socketBudget{maxSockets: 8, maxPending: 6, maxPerAddr: 2}, []string{"127.0.0.0/8"})
	addr := func(s string) netip.Prefix { return source(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))) }
	a1, a2 := addr("192.0.2.1:1000"), addr("[2001:db8::1]:1000")
	if a3 := addr("[2001:db8::ffff:1]:2000"); a3 != a2 {
		t.Fatalf("one /64: %v and %v", a2, a3)
	}
	if m := addr("[::ffff:192.0.2.1]:3"); m != a1 {
		t.Fatalf("IPv4-mapped %v, want %v", m, a1)
	}
	want := func(src netip.Prefix, ok bool, r Refusal) {
		t.Helper()
		got, gotOK := g.admit(src)
		if gotOK != ok || (!ok && got != r) {
			t.Fatalf("admit %v: %v %v; want %v %v", src, got, gotOK, r, ok)
		}
	}
	want(a1, true, 0)
	want(a1, true, 0)
	want(a1, false, RefusedPendingPerAddress)
	want(a2, true, 0)
	want(addr("[2001:db8::2]:1"), true, 0)
	want(addr("[2001:db8::3]:1"), false, RefusedPendingPerAddress) // the same /64
	lo := addr("127.0.0.1:1")
	want(lo, true, 0) // exempt from the per-address bound,
	want(lo, true, 0)
	want(lo, false, RefusedPendingConnects) // not from the total
	g.connected(a1)                         // CONNECT read: its pending place is free, its socket still open
	want(addr("192.0.2.9:1"), true, 0)
	g.connected(a2)
	want(addr("192.0.2.10:1"), true, 0) // 8 open
	g.connected(lo)
	want(addr("192.0.2.11:1"), false, RefusedFileLimit)
	g.closed()
	want(addr("192.0.2.11:1"), true, 0)
	if open, pending := g.counts(); open != 8 || pending != 6 {
		t.Errorf("open %d, pending %d; want 8, 6", open, pending)
	}
}

// TestFileReserve: with a low file limit, the broker holds no more MQTT
// sockets than the limit less fileReserve: more are closed at accept and
// counted (file_limit), and the rest of the process still opens files.
func TestFileReserve(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// The clients are this process too (each connection is two
	// descriptors): the limit is low enough for the broker's budget to
	// run out first.
	open := openFiles(t)
	if open > 100 {
		t.Skipf("%d files open", open)
	}
	low := lim
	low.Cur = uint64(open + fileReserve + 24)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("lower RLIMIT_NOFILE: %v", err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}()
	o := listenerOptions(t)
	o.MaxPendingConnectsPerAddress = o.MaxPendingConnects
	b := startBroker(t, o, nil)
	st := b.Stats()
	if want := int(low.Cur) - fileReserve; st.MaxSockets != want {
		t.Fatalf("MQTT sockets %d, want the file limit %d less %d", st.MaxSockets, low.Cur, fileReserve)
	}
	// Pending sockets are held to half the budget; connected ones fill
	// the rest.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	const over = 5
	for i := range st.MaxSockets + over {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		if code, err := connect311Within(c, fmt.Sprintf("r%d", i), patience); i < st.MaxSockets && (err != nil || code != 0) {
			t.Fatalf("client %d of %d: code %d, %v", i, st.MaxSockets, code, err)
		} else if i >= st.MaxSockets && err == nil {
			t.Fatalf("client %d beyond the budget of %d connected", i, st.MaxSockets)
		}
	}
	if got := b.Stats().Refused["file_limit"]; got != over {
		t.Errorf("file_limit refusals %d, want %d", got, over)
	}
	f, err := os.CreateTemp(t.TempDir(), "segment-*")
	if err != nil {
		t.Fatalf("a new journal segment with MQTT at its budget: %v", err)
	}
	f.Close()
}
