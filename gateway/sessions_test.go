package gateway_test

import (
	"fmt"
	"testing"

	"github.com/eclipse/paho.golang/packets"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// sessionConfig: users dev-1, dev-2, dash (subscriber) and ops (admin),
// no anonymous clients.
func sessionConfig(t *testing.T) *configs.Config {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = false
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dev-1": "pw-1", "dev-2": "pw-2", "dash": "pw-d", "ops": "pw-o"})
	cfg.MQTT.ACL.Users = map[string]string{"dash": "subscriber", "ops": "admin"}
	return cfg
}

// dialSession connects an MQTT 5 client as user with client id id and a
// persistent session (expiry 1 h), new or resumed, and returns it with the
// CONNACK's reason code and session-present flag.
func dialSession(t *testing.T, addr, id, user, pass string, resume bool) (*v5, byte, bool) {
	t.Helper()
	c := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: !resume, KeepAlive: 30,
		UsernameFlag: true, Username: user, PasswordFlag: true, Password: []byte(pass),
		Properties: &packets.Properties{SessionExpiryInterval: ptr(uint32(3600))}}
	conn := dial(t, addr)
	// Held until the test ends: a connection the test drops would be
	// closed by the garbage collector's finalizer, and its session would
	// be away (and the first to end for room) without the test saying so.
	t.Cleanup(func() { conn.Close() })
	cl, code := connectV5(t, conn, c)
	return cl, code, cl.connack.SessionPresent
}

// leave disconnects c and waits until the broker has seen it (its client
// count is down to want).
func leave(t *testing.T, gw *gateway.Gateway, c *v5, want int64) {
	t.Helper()
	c.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.DISCONNECT}, Content: &packets.Disconnect{Properties: &packets.Properties{}}})
	closed(c.conn)
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.Clients == want }); st.Clients != want {
		t.Fatalf("%d clients connected, want %d", st.Clients, want)
	}
}

// TestClientIDBinding: a device may use its identity as client id, or its
// identity, ':' and a suffix, and no other; nobody but an admin may take a
// client id that belongs to another identity's connection; refusals get
// CONNACK 0x85 (3.1.1: return code 2) and are counted, and the device
// whose id was tried stays connected.
func TestClientIDBinding(t *testing.T) {
	gw, stop := runGateway(t, sessionConfig(t))
	defer stop()
	addr := gw.Addr()
	for _, tc := range []struct {
		name, id, user, pass string
		want                 byte
	}{
		{"its identity", "dev-1", "dev-1", "pw-1", 0},
		{"its identity and a suffix", "dev-1:ota", "dev-1", "pw-1", 0},
		{"another device's id", "dev-2", "dev-1", "pw-1", 0x85},
		{"another device's prefixed id", "dev-2:x", "dev-1", "pw-1", 0x85},
		{"its identity as a mere prefix", "dev-10", "dev-1", "pw-1", 0x85},
		{"its identity, another separator", "dev-1-x", "dev-1", "pw-1", 0x85},
	} {
		c, code := dialV5(t, dial(t, addr), tc.id, tc.user, tc.pass)
		if code != tc.want {
			t.Errorf("%s (%s as %s): CONNACK %#x, want %#x", tc.name, tc.id, tc.user, code, tc.want)
		}
		c.conn.Close()
	}
	c3 := dial(t, addr)
	defer c3.Close()
	c3.Write(v3Connect("dev-2", "dev-1", "pw-1"))
	if f, err := readFrame(c3); err != nil || len(f) != 3 || f[0] != 0x20 || f[2] != 2 {
		t.Errorf("3.1.1 dev-1 as dev-2: CONNACK %x (%v), want return code 2", f, err)
	}

	dev2, code := dialV5(t, dial(t, addr), "dev-2", "dev-2", "pw-2")
	if code != 0 {
		t.Fatalf("dev-2: CONNACK %#x", code)
	}
	if _, code := dialV5(t, dial(t, addr), "dev-2", "dash", "pw-d"); code != 0x85 {
		t.Errorf("subscriber taking dev-2's connected client id: CONNACK %#x, want 0x85", code)
	}
	if got := dev2.publish(1, "sensors/dev-2/temp", "20"); got != 0 {
		t.Errorf("dev-2 after the attempt: PUBACK %#x, want 0", got)
	}
	if _, code := dialV5(t, dial(t, addr), "dev-2", "ops", "pw-o"); code != 0 {
		t.Errorf("admin taking dev-2's client id: CONNACK %#x, want 0", code)
	}
	if n := refused(t, gw, "client_id_not_allowed", 6); n != 6 {
		t.Errorf("client_id_not_allowed refusals %d, want 6", n)
	}
}

// TestSessionLimits: persistent sessions are capped per identity (2) and
// in total (3). A new one ends the away session of the same identity (for
// the total: of anyone) closest to its expiry, which is then gone; when
// every session is connected, the new one is refused with CONNACK 0x97.
func TestSessionLimits(t *testing.T) {
	cfg := sessionConfig(t)
	cfg.MQTT.MaxSessions, cfg.MQTT.MaxSessionsPerIdentity = 3, 2
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()
	connect := func(id, user, pass string, resume bool) (*v5, bool) {
		t.Helper()
		c, code, present := dialSession(t, addr, id, user, pass, resume)
		if code != 0 {
			t.Fatalf("%s: CONNACK %#x", id, code)
		}
		return c, present
	}
	a, _ := connect("dev-1:a", "dev-1", "pw-1", false)
	leave(t, gw, a, 0)
	b, _ := connect("dev-1:b", "dev-1", "pw-1", false)
	leave(t, gw, b, 0)
	c, _ := connect("dev-1:c", "dev-1", "pw-1", false) // ends dev-1:a's session
	leave(t, gw, c, 0)
	if _, present := connect("dev-1:b", "dev-1", "pw-1", true); !present {
		t.Error("dev-1:b resumed: session not present, want present (kept)")
	}
	if _, present := connect("dev-1:a", "dev-1", "pw-1", true); present { // ends dev-1:c's
		t.Error("dev-1:a resumed: session present, want ended to make room")
	}
	connect("dev-2:x", "dev-2", "pw-2", false) // the third session in all
	if _, code, _ := dialSession(t, addr, "dev-2:y", "dev-2", "pw-2", false); code != 0x97 {
		t.Errorf("a fourth session, every one connected: CONNACK %#x, want 0x97", code)
	}
	c3 := dial(t, addr)
	defer c3.Close()
	c3.Write(v3ConnectSession("dev-2:w", "dev-2", "pw-2"))
	if f, err := readFrame(c3); err != nil || len(f) != 3 || f[0] != 0x20 || f[2] != 3 {
		t.Errorf("3.1.1 session at the limit: CONNACK %x (%v), want return code 3", f, err)
	}
	// A connection without a persistent session needs no room.
	if cl, code := dialV5(t, dial(t, addr), "dev-2:z", "dev-2", "pw-2"); code != 0 {
		t.Errorf("a clean connection at the limit: CONNACK %#x, want 0", code)
	} else {
		cl.conn.Close()
	}
	if n := refused(t, gw, "session_limit", 2); n != 2 {
		t.Errorf("session_limit refusals %d, want 2", n)
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Sessions == 3 })
	if st.Sessions != 3 || st.SessionsEvicted != 2 {
		t.Errorf("%d sessions, %d evicted; want 3 (dev-1:b, dev-1:a, dev-2:x), 2 (dev-1:a, dev-1:c)", st.Sessions, st.SessionsEvicted)
	}
}

// v3ConnectSession is an MQTT 3.1.1 CONNECT with clean session 0.
func v3ConnectSession(id, user, pass string) []byte {
	b := v3Connect(id, user, pass)
	b[9] &^= 0x02 // connect flags, after the fixed header, "MQTT" and the level
	return b
}

// TestAnonymousSessionLimit: with anonymous access every new client id
// is a new identity, so the per-identity cap does not bound them. Their
// persistent sessions have a cap of their own (half of mqtt.max_sessions),
// and an anonymous newcomer makes room only among anonymous sessions: a
// flood of new anonymous client ids never ends a named identity's away
// session; with every anonymous session connected, it is refused.
func TestAnonymousSessionLimit(t *testing.T) {
	cfg := sessionConfig(t)
	cfg.MQTT.AllowAnonymous = true
	cfg.MQTT.MaxSessions, cfg.MQTT.MaxSessionsPerIdentity = 4, 2
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()
	connect := func(id, user, pass string, resume bool) (*v5, bool) {
		t.Helper()
		c, code, present := dialSession(t, addr, id, user, pass, resume)
		if code != 0 {
			t.Fatalf("%s: CONNACK %#x", id, code)
		}
		return c, present
	}
	anonymous := func(id string) (*v5, byte) {
		t.Helper()
		c := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true, KeepAlive: 30,
			Properties: &packets.Properties{SessionExpiryInterval: ptr(uint32(3600))}}
		return connectV5(t, dial(t, addr), c)
	}
	d1, _ := connect("dev-1", "dev-1", "pw-1", false)
	leave(t, gw, d1, 0)
	d2, _ := connect("dev-2", "dev-2", "pw-2", false)
	leave(t, gw, d2, 0)
	// Twenty new anonymous identities, one after the other: each leaves
	// its session behind.
	for i := range 20 {
		c, code := anonymous(fmt.Sprintf("anon-%02d", i))
		if code != 0 {
			t.Fatalf("anon-%02d: CONNACK %#x", i, code)
		}
		leave(t, gw, c, 0)
	}
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.Sessions == 4 }); st.Sessions != 4 {
		t.Errorf("%d sessions, want 4 (dev-1, dev-2 and two anonymous)", st.Sessions)
	}
	for _, id := range []string{"dev-1", "dev-2"} {
		c, present := connect(id, id, "pw-"+id[len(id)-1:], true)
		if !present {
			t.Errorf("%s resumed after the anonymous flood: session not present, want kept", id)
		}
		defer c.conn.Close()
	}
	// The two anonymous sessions kept are the latest; connected, they
	// leave an anonymous newcomer no room, and named sessions are not
	// its to end.
	for _, id := range []string{"anon-18", "anon-19"} {
		c := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, KeepAlive: 30,
			Properties: &packets.Properties{SessionExpiryInterval: ptr(uint32(3600))}}
		cl, code := connectV5(t, dial(t, addr), c)
		if code != 0 || !cl.connack.SessionPresent {
			t.Errorf("%s resumed: CONNACK %#x, session present %v; want 0, present", id, code, cl.connack.SessionPresent)
		}
	}
	if _, code := anonymous("anon-new"); code != 0x97 {
		t.Errorf("an anonymous session with every anonymous one connected: CONNACK %#x, want 0x97", code)
	}
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.Sessions == 4 }); st.Sessions != 4 || st.SessionsEvicted != 18 {
		t.Errorf("%d sessions, %d evicted; want 4, 18 (anonymous ones)", st.Sessions, st.SessionsEvicted)
	}
}
