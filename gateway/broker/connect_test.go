package broker

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"golang.org/x/crypto/bcrypt"

	"github.com/edgegate/edgegate/gateway/journal"
)

// nopJournal journals nothing: the tests here publish on no reading topic.
type nopJournal struct{}

func (nopJournal) Publish(string, string, any, byte, uint16, string, []byte, bool) (*journal.Batch, int, error) {
	return nil, 0, nil
}
func (nopJournal) Received(string, uint64) error                        { return nil }
func (nopJournal) SessionStart(string, journal.Session) error           { return nil }
func (nopJournal) SessionEnd(string) error                              { return nil }
func (nopJournal) Subscribe(string, string, journal.Subscription) error { return nil }
func (nopJournal) Unsubscribe(string, string) error                     { return nil }
func (nopJournal) Pubrel(string, uint16) (*journal.Batch, error)        { return nil, nil }

// noReadings: no topic carries readings.
type noReadings struct{}

func (noReadings) ReadingTopic(string) bool { return false }
func (noReadings) Full() bool               { return false }
func (noReadings) WillTopic(string) bool    { return false }

// testOptions: users from users (passwords hashed at bcrypt's least
// cost), no anonymous clients, no connection rate.
func testOptions(t *testing.T, users map[string]string) Options {
	var b []byte
	for u, pw := range users {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, u+":"+string(h)+"\n"...)
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return Options{
		Listen:    "127.0.0.1:0",
		UsersFile: path,
		Roles: map[string]Filters{"device": {Publish: []string{"sensors/{username}/+"}, Subscribe: []string{"commands/{username}/#"}},
			"admin": {Publish: []string{"#"}, Subscribe: []string{"#"}}},
		AnonymousRole: "device",
		MaxPacket:     1 << 16, ReceiveMaximum: 16, ClientWriteQueue: 16, ClientReadBuffer: 1024, ClientWriteBuffer: 512,
		MaxSessionExpiry: time.Hour, MaxSessions: 100, MaxSessionsPerIdentity: 100, ClientIDs: ClientIDAny,
		MaxClients: 1000, MaxSubscriptions: 8, ConnectTimeout: 10 * time.Second, MaxKeepAlive: 10 * time.Minute,
		WriteTimeout: 10 * time.Second,
	}
}

// startBroker serves a broker with options o on a loopback port until the
// test ends; setup, if not nil, sees it before it serves.
func startBroker(t *testing.T, o Options, setup func(*Broker)) *Broker {
	t.Helper()
	b, err := New(o, noReadings{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(b)
	}
	if err := b.Listen(nopJournal{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Serve(Restored{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// patience is how long a test waits for what must come: long enough for
// a loaded machine, short enough to report a hang.
const patience = 30 * time.Second

// connectV5 sends an MQTT 5 CONNECT and returns the connection and the
// CONNACK.
func connectV5(t *testing.T, addr, id, user, pass string, keepAlive uint16) (net.Conn, *packets.Connack) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true, KeepAlive: keepAlive, Properties: &packets.Properties{}}
	if user != "" {
		c.Username, c.UsernameFlag = user, true
		c.Password, c.PasswordFlag = []byte(pass), true
	}
	if _, err := (&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT}, Content: c}).WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(patience))
	cp, err := packets.ReadPacket(conn)
	if err != nil {
		t.Fatalf("%s: read CONNACK: %v", id, err)
	}
	ack, ok := cp.Content.(*packets.Connack)
	if !ok {
		t.Fatalf("%s: %T, want a CONNACK", id, cp.Content)
	}
	return conn, ack
}

// connectV3 sends an MQTT 3.1.1 CONNECT (clean session, keep alive 30 s)
// and returns the connection and the CONNACK's return code.
func connectV3(t *testing.T, addr, id, user, pass string) (net.Conn, byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	str := func(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }
	flags := byte(0x02)
	body := append(str("MQTT"), 4, 0, 0, 30)
	body = append(body, str(id)...)
	if user != "" {
		flags |= 0xc0
		body = append(append(body, str(user)...), str(pass)...)
	}
	body[7] = flags
	if _, err := conn.Write(append([]byte{0x10, byte(len(body))}, body...)); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(patience))
	ack := make([]byte, 4)
	if _, err := io.ReadFull(conn, ack); err != nil {
		t.Fatalf("%s: read CONNACK: %v", id, err)
	}
	if ack[0] != 0x20 || ack[1] != 2 {
		t.Fatalf("%s: % x, want a CONNACK", id, ack)
	}
	return conn, ack[3]
}

// TestPasswordChecksBounded: a storm of CONNECTs with wrong passwords and
// unknown usernames never has more than mqtt.max_password_checks bcrypt
// comparisons running at once; those that find no slot in time are
// refused as server busy (CONNACK 0x89, 3.1.1: 3) and counted as
// auth_busy, the others as bad_credentials; a device whose password is
// cached connects through the storm, and one whose is not, after it.
func TestPasswordChecksBounded(t *testing.T) {
	const slots, storm = 2, 30
	users := map[string]string{"dev-1": "pw-1", "good": "pw-g", "late": "pw-l"}
	o := testOptions(t, users)
	o.PasswordChecks = slots
	var running, peak, compared atomic.Int32
	b := startBroker(t, o, func(b *Broker) {
		b.hook.auth.SetCompare(func(hash, pw []byte) error {
			n := running.Add(1)
			defer running.Add(-1)
			compared.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(500 * time.Millisecond) // a Pi's bcrypt, and more: 4 checks a second
			return bcrypt.CompareHashAndPassword(hash, pw)
		})
	})
	addr := b.Addr()

	if _, ack := connectV5(t, addr, "good", "good", "pw-g", 30); ack.ReasonCode != 0 {
		t.Fatalf("good device before the storm: CONNACK 0x%02x", ack.ReasonCode)
	}

	var mu sync.Mutex
	codes := map[string]int{} // "v5 0x86", "v3 3", ...
	var wg sync.WaitGroup
	for i := range storm {
		wg.Go(func() {
			user, pass := "dev-1", "wrong"
			if i%2 == 1 {
				user, pass = "nobody", "pw-1" // unknown: the same cost
			}
			var key string
			if i%3 == 0 {
				_, code := connectV3(t, addr, "bad", user, pass)
				key = "v3 " + string('0'+code)
			} else {
				_, ack := connectV5(t, addr, "bad", user, pass, 30)
				key = "v5 " + string("0123456789abcdef"[ack.ReasonCode>>4]) + string("0123456789abcdef"[ack.ReasonCode&15])
			}
			mu.Lock()
			codes[key]++
			mu.Unlock()
		})
	}
	time.Sleep(100 * time.Millisecond) // the storm is on
	start := time.Now()
	if _, ack := connectV5(t, addr, "good", "good", "pw-g", 30); ack.ReasonCode != 0 {
		t.Errorf("good device during the storm: CONNACK 0x%02x, want success (its password is cached)", ack.ReasonCode)
	}
	during := time.Since(start)
	wg.Wait()

	busy := codes["v5 89"] + codes["v3 3"]
	bad := codes["v5 86"] + codes["v3 5"]
	t.Logf("storm of %d: CONNACKs %v; %d comparisons, at most %d at once; the cached device connected in %s", storm, codes, compared.Load(), peak.Load(), during)
	if p := peak.Load(); p > slots {
		t.Errorf("%d password checks ran at once, want at most %d", p, slots)
	}
	if busy+bad != storm {
		t.Errorf("CONNACKs %v: want every one bad credentials (0x86, 3.1.1: 5) or server busy (0x89, 3.1.1: 3)", codes)
	}
	if busy == 0 {
		t.Errorf("no CONNECT refused as server busy: %v", codes)
	}
	st := b.Stats().Refused
	if st["auth_busy"] != int64(busy) || st["bad_credentials"] != int64(bad) {
		t.Errorf("refusals counted: auth_busy %d, bad_credentials %d; want %d, %d", st["auth_busy"], st["bad_credentials"], busy, bad)
	}
	if st["server_busy"] != 0 {
		t.Errorf("counted as server_busy (mqtt.max_clients): %d", st["server_busy"])
	}
	if _, ack := connectV5(t, addr, "late", "late", "pw-l", 30); ack.ReasonCode != 0 {
		t.Errorf("device after the storm: CONNACK 0x%02x", ack.ReasonCode)
	}
}
