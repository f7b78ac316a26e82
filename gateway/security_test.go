package gateway_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/gorilla/websocket"
	"golang.org/x/crypto/bcrypt"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/configs/testpki"
	"github.com/edgegate/edgegate/gateway"
)

func writeUsers(t *testing.T, users map[string]string) string {
	t.Helper()
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
	return path
}

// v5 is an MQTT 5 client speaking raw packets, to see exact reason codes.
type v5 struct {
	t       *testing.T
	conn    net.Conn
	connack *packets.Connack
}

// dialV5 connects over conn and returns the client and the CONNACK reason
// code.
func dialV5(t *testing.T, conn net.Conn, id, user, pass string) (*v5, byte) {
	t.Helper()
	t.Cleanup(func() { conn.Close() })
	c := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true, KeepAlive: 30, Properties: &packets.Properties{}}
	if user != "" {
		c.Username, c.UsernameFlag = user, true
	}
	if pass != "" {
		c.Password, c.PasswordFlag = []byte(pass), true
	}
	return connectV5(t, conn, c)
}

// connectV5 sends c over conn and returns the client and the CONNACK's
// reason code.
func connectV5(t *testing.T, conn net.Conn, c *packets.Connect) (*v5, byte) {
	t.Helper()
	cl := &v5{t: t, conn: conn}
	cl.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT}, Content: c})
	ack, ok := cl.read().Content.(*packets.Connack)
	if !ok {
		t.Fatal("no CONNACK")
	}
	cl.connack = ack
	return cl, ack.ReasonCode
}

func (c *v5) write(cp *packets.ControlPacket) {
	c.t.Helper()
	if _, err := cp.WriteTo(c.conn); err != nil {
		c.t.Fatal(err)
	}
}

func (c *v5) read() *packets.ControlPacket {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(patience))
	cp, err := packets.ReadPacket(c.conn)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return cp
}

// publish sends a QoS 1 PUBLISH and returns the PUBACK reason code.
func (c *v5) publish(pid uint16, topic, payload string) byte {
	c.t.Helper()
	c.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2},
		Content: &packets.Publish{QoS: 1, PacketID: pid, Topic: topic, Payload: []byte(payload), Properties: &packets.Properties{}}})
	ack, ok := c.read().Content.(*packets.Puback)
	if !ok || ack.PacketID != pid {
		c.t.Fatalf("publish %d: no PUBACK", pid)
	}
	return ack.ReasonCode
}

// subscribe sends a SUBSCRIBE of one filter and returns the SUBACK's code.
func (c *v5) subscribe(pid uint16, filter string) byte {
	c.t.Helper()
	c.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.SUBSCRIBE, Flags: 2},
		Content: &packets.Subscribe{PacketID: pid, Subscriptions: []packets.SubOptions{{Topic: filter, QoS: 1}}, Properties: &packets.Properties{}}})
	ack, ok := c.read().Content.(*packets.Suback)
	if !ok || ack.PacketID != pid || len(ack.Reasons) != 1 {
		c.t.Fatalf("subscribe %d: no SUBACK", pid)
	}
	return ack.Reasons[0]
}

// v3 frames for MQTT 3.1.1, written by hand: paho.golang speaks only 5.
func mqttString(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

func frame(first byte, body []byte) []byte {
	b := []byte{first}
	n := len(body)
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			break
		}
	}
	return append(b, body...)
}

func v3Connect(id, user, pass string) []byte {
	flags := byte(0x02) // clean session
	body := append(mqttString("MQTT"), 4, 0, 0, 30)
	body = append(body, mqttString(id)...)
	if user != "" {
		flags |= 0x80
		body = append(body, mqttString(user)...)
	}
	if pass != "" {
		flags |= 0x40
		body = append(body, mqttString(pass)...)
	}
	body[7] = flags
	return frame(0x10, body)
}

func v3Publish(pid uint16, topic, payload string) []byte {
	body := append(mqttString(topic), byte(pid>>8), byte(pid))
	return frame(0x32, append(body, payload...))
}

// readFrame reads one MQTT frame from conn: its first byte and its body.
func readFrame(conn net.Conn) ([]byte, error) {
	conn.SetReadDeadline(time.Now().Add(patience))
	hdr := make([]byte, 2)
	if _, err := conn.Read(hdr[:1]); err != nil {
		return nil, err
	}
	n, mul := 0, 1
	for {
		if _, err := conn.Read(hdr[1:2]); err != nil {
			return nil, err
		}
		n += int(hdr[1]&0x7f) * mul
		if hdr[1]&0x80 == 0 {
			break
		}
		mul *= 128
	}
	body := make([]byte, n)
	for off := 0; off < n; {
		k, err := conn.Read(body[off:])
		if err != nil {
			return nil, err
		}
		off += k
	}
	return append([]byte{hdr[0]}, body...), nil
}

// closed reports whether the peer closes conn within patience, reading
// what it sends before.
func closed(conn net.Conn) bool {
	conn.SetReadDeadline(time.Now().Add(patience))
	_, err := io.Copy(io.Discard, conn)
	return !os.IsTimeout(err)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// secureConfig: no anonymous clients, users dev-1, dev-2, dash
// (subscriber) and ops (admin); a TLS listener whose client CA makes
// certificates identities.
func secureConfig(t *testing.T, ca *testpki.CA) *configs.Config {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = false
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dev-1": "pw-1", "dev-2": "pw-2", "dash": "pw-d", "ops": "pw-o"})
	cfg.MQTT.ACL.Users = map[string]string{"dash": "subscriber", "ops": "admin"}
	cfg.MQTT.TLS.Listen = "127.0.0.1:0"
	cfg.MQTT.TLS.CertFile, cfg.MQTT.TLS.KeyFile, _ = ca.Issue("gateway", true)
	cfg.MQTT.TLS.ClientCAFile = ca.File
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAuthAndACL checks identities and ACLs over the real listeners with
// the exact MQTT 5 reason codes, 3.1.1 return codes and disconnects, and
// that a refused reading is counted and never aggregated.
func TestAuthAndACL(t *testing.T) {
	ca := testpki.New(t, "test-ca")
	cfg := secureConfig(t, ca)
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()

	// CONNECT.
	for _, tc := range []struct {
		name, user, pass string
		want             byte
	}{
		{"right password", "dev-1", "pw-1", 0},
		{"right password again (cached)", "dev-1", "pw-1", 0},
		{"wrong password", "dev-1", "pw-2", 0x86},
		{"no password", "dev-1", "", 0x86},
		{"unknown user", "dev-9", "pw-1", 0x86},
		{"anonymous", "", "", 0x86},
	} {
		if _, code := dialV5(t, dial(t, addr), tc.user+":c", tc.user, tc.pass); code != tc.want {
			t.Errorf("%s: CONNACK %#x, want %#x", tc.name, code, tc.want)
		}
	}
	// 3.1.1: a refused CONNECT gets return code 5 (not authorized).
	c3 := dial(t, addr)
	defer c3.Close()
	c3.Write(v3Connect("c3", "dev-1", "bad"))
	if f, err := readFrame(c3); err != nil || len(f) != 3 || f[0] != 0x20 || f[2] != 5 {
		t.Errorf("3.1.1 bad password: CONNACK %x (%v), want return code 5", f, err)
	}

	// PUBLISH and SUBSCRIBE by role.
	dev, _ := dialV5(t, dial(t, addr), "dev-1:client", "dev-1", "pw-1")
	dash, _ := dialV5(t, dial(t, addr), "dash", "dash", "pw-d")
	ops, _ := dialV5(t, dial(t, addr), "ops", "ops", "pw-o")
	for _, tc := range []struct {
		name  string
		c     *v5
		topic string
		want  byte
	}{
		{"device to its own metric topic", dev, "sensors/dev-1/temp", 0},
		{"device to its own object topic", dev, "sensors/dev-1", 0}, // a dead letter: not an object
		{"device under another device", dev, "sensors/dev-2/temp", 0x87},
		{"device to a deeper topic", dev, "sensors/dev-1/temp/x", 0x87},
		{"device outside sensors", dev, "other/dev-1", 0x87},
		{"subscriber publishing", dash, "sensors/dash/temp", 0x87},
		{"admin anywhere", ops, "sensors/dev-2/temp", 0},
	} {
		if code := tc.c.publish(uint16(len(tc.name)), tc.topic, "21.5"); code != tc.want {
			t.Errorf("%s: PUBACK %#x, want %#x", tc.name, code, tc.want)
		}
	}
	for _, tc := range []struct {
		name   string
		c      *v5
		filter string
		want   byte
	}{
		{"device to its commands", dev, "commands/dev-1/#", 1},
		{"device to another's commands", dev, "commands/dev-2/#", 0x87},
		{"device to #", dev, "#", 0x87},
		{"device to $SYS", dev, "$SYS/#", 0x87},
		{"device to all readings", dev, "sensors/#", 0x87},
		{"subscriber to readings", dash, "sensors/+/+", 1},
		{"subscriber to one device", dash, "sensors/dev-1/temp", 1},
		{"subscriber to #", dash, "#", 0x87},
		{"subscriber to sensors/#", dash, "sensors/#", 0x87}, // deeper than the reading topics
		{"admin to #", ops, "#", 1},
		{"admin to $SYS", ops, "$SYS/#", 1},
	} {
		if code := tc.c.subscribe(uint16(len(tc.name)), tc.filter); code != tc.want {
			t.Errorf("%s: SUBACK %#x, want %#x", tc.name, code, tc.want)
		}
	}
	// Deliveries pass the ACL too: the dashboard and the admin get a
	// device's reading, and nothing is counted as refused.
	if code := dev.publish(99, "sensors/dev-1/temp", "22"); code != 0 {
		t.Fatalf("PUBACK %#x", code)
	}
	for name, c := range map[string]*v5{"dashboard": dash, "admin": ops} {
		var p *packets.Publish
		for range 50 { // the admin also gets the broker's retained $SYS topics
			if p, _ = c.read().Content.(*packets.Publish); p == nil || !strings.HasPrefix(p.Topic, "$SYS/") {
				break
			}
		}
		if p == nil || p.Topic != "sensors/dev-1/temp" || string(p.Payload) != "22" {
			t.Errorf("%s got %v, want the reading", name, p)
		}
	}
	// 3.1.1: a refused publication closes the connection. (mochi writes
	// a DISCONNECT first, which 3.1.1 clients ignore.)
	c3 = dial(t, addr)
	defer c3.Close()
	c3.Write(v3Connect("dev-2", "dev-2", "pw-2"))
	if f, err := readFrame(c3); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("3.1.1 connect: %x %v", f, err)
	}
	c3.Write(v3Publish(1, "sensors/dev-1/temp", "1"))
	if !closed(c3) {
		t.Error("3.1.1 publication under another device: connection not closed")
	}

	// TLS with client certificates: the certificate names the device.
	_, _, dev3 := ca.Issue("dev-3", false)
	tlsDial := func(certs ...tls.Certificate) (net.Conn, error) {
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		c := &tls.Config{RootCAs: pool}
		if len(certs) > 0 {
			// Send the certificate even if its CA is not one the server
			// asks for.
			c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		return tls.Dial("tcp", gw.TLSAddr(), c)
	}
	conn, err := tlsDial(dev3)
	if err != nil {
		t.Fatal(err)
	}
	d3, code := dialV5(t, conn, "dev-3:any", "", "")
	if code != 0 {
		t.Fatalf("certificate dev-3: CONNACK %#x", code)
	}
	if c := d3.publish(1, "sensors/dev-3/temp", "20"); c != 0 {
		t.Errorf("dev-3 to its own topic: PUBACK %#x", c)
	}
	if c := d3.publish(2, "sensors/dev-1/temp", "20"); c != 0x87 {
		t.Errorf("dev-3 under dev-1: PUBACK %#x, want 0x87", c)
	}
	if conn, err = tlsDial(dev3); err != nil {
		t.Fatal(err)
	}
	if _, code := dialV5(t, conn, "x", "dev-1", "pw-1"); code != 0x86 {
		t.Errorf("certificate dev-3 with username dev-1: CONNACK %#x, want 0x86", code)
	}
	// Without a certificate, TLS clients log in with a password.
	if conn, err = tlsDial(); err != nil {
		t.Fatal(err)
	}
	if _, code := dialV5(t, conn, "dev-2:y", "dev-2", "pw-2"); code != 0 {
		t.Errorf("TLS with password: CONNACK %#x", code)
	}
	// A certificate from another CA fails the handshake.
	_, _, stranger := testpki.New(t, "other-ca").Issue("dev-1", false)
	if conn, err = tlsDial(stranger); err == nil {
		// TLS 1.3 reports the client certificate's rejection on first read.
		conn.Write(v3Connect("z", "", ""))
		_, err = readFrame(conn)
		conn.Close()
	}
	if err == nil {
		t.Error("certificate from an unknown CA accepted")
	}
	// TLS below 1.2 is refused.
	if c, err := tls.Dial("tcp", gw.TLSAddr(), &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}); err == nil {
		c.Close()
		t.Error("TLS 1.1 handshake succeeded")
	}

	// Exactly the allowed readings were taken: dev-1's two, ops's and
	// dev-3's; each refusal was counted (the 3.1.1 ones too).
	st := settled(t, gw, func(st gateway.Stats) bool {
		return st.Outcomes["aggregated"] >= 4 && st.MQTTRefused["tls_handshake"] >= 2
	})
	time.Sleep(50 * time.Millisecond)
	st = gw.Stats()
	if st.Outcomes["aggregated"] != 4 {
		t.Errorf("aggregated %d readings, want 4", st.Outcomes["aggregated"])
	}
	want := map[string]int64{"bad_credentials": 6, "publish_not_authorized": 6, "subscribe_not_authorized": 6, "tls_handshake": 2}
	for r, n := range want {
		if st.MQTTRefused[r] != n {
			t.Errorf("refused %s = %d, want %d", r, st.MQTTRefused[r], n)
		}
	}
}

// TestTLSReload: after the certificate files are replaced and Reload is
// called (SIGHUP), new connections get the new certificate, and a device
// added to the users file can log in.
func TestTLSReload(t *testing.T) {
	ca := testpki.New(t, "reload-ca")
	cfg := secureConfig(t, ca)
	gw, stop := runGateway(t, cfg)
	defer stop()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	serialOf := func() *big.Int {
		c, err := tls.Dial("tcp", gw.TLSAddr(), &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	before := serialOf()
	cert, key, pair := ca.Issue("gateway", true)
	for src, dst := range map[string]string{cert: cfg.MQTT.TLS.CertFile, key: cfg.MQTT.TLS.KeyFile} {
		b, _ := os.ReadFile(src)
		os.WriteFile(dst, b, 0o600)
	}
	if serialOf().Cmp(before) != 0 {
		t.Fatal("certificate changed before reload")
	}
	os.WriteFile(cfg.MQTT.UsersFile, []byte(""), 0o600)
	if _, code := dialV5(t, dial(t, gw.Addr()), "dev-1:n", "dev-1", "pw-1"); code != 0 {
		t.Fatalf("before reload: CONNACK %#x", code)
	}
	b, _ := os.ReadFile(writeUsers(t, map[string]string{"dev-new": "pw-n"}))
	os.WriteFile(cfg.MQTT.UsersFile, b, 0o600)
	if err := gw.Reload(); err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if got := serialOf(); got.Cmp(leaf.SerialNumber) != 0 {
		t.Errorf("after reload: serial %v, want %v", got, leaf.SerialNumber)
	}
	if _, code := dialV5(t, dial(t, gw.Addr()), "dev-new", "dev-new", "pw-n"); code != 0 {
		t.Errorf("new user after reload: CONNACK %#x", code)
	}
	if _, code := dialV5(t, dial(t, gw.Addr()), "dev-1:n3", "dev-1", "pw-1"); code != 0x86 {
		t.Errorf("removed user after reload: CONNACK %#x, want 0x86", code)
	}
	// A broken file is refused and the old certificate stays.
	os.WriteFile(cfg.MQTT.TLS.KeyFile, []byte("garbage"), 0o600)
	if err := gw.Reload(); err == nil {
		t.Error("reload of a garbage key succeeded")
	}
	if got := serialOf(); got.Cmp(leaf.SerialNumber) != 0 {
		t.Errorf("after failed reload: serial %v, want %v", got, leaf.SerialNumber)
	}
}

// TestSecureDefaults: a configuration that says nothing about
// authentication does not load, and with a users file an anonymous
// CONNECT is refused.
func TestSecureDefaults(t *testing.T) {
	if _, err := configs.Parse([]byte("kafka: {brokers: [\"k:9092\"]}\n")); err == nil {
		t.Error("a configuration without users_file or allow_anonymous loaded")
	}
	c, err := configs.Parse([]byte("kafka: {brokers: [\"k:9092\"]}\nmqtt: {users_file: /etc/edgegate/users}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.MQTT.AllowAnonymous {
		t.Error("allow_anonymous defaults to true")
	}
	if c.MQTT.ACL.AnonymousRole != "device" {
		t.Errorf("anonymous_role defaults to %q, want device", c.MQTT.ACL.AnonymousRole)
	}
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = c.MQTT.AllowAnonymous
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dev-1": "pw"})
	gw, stop := runGateway(t, cfg)
	defer func() { stop() }() // the gateway running when the test ends
	if _, code := dialV5(t, dial(t, gw.Addr()), "anon", "", ""); code != 0x86 {
		t.Errorf("anonymous CONNECT: %#x, want 0x86", code)
	}
	stop()

	// Anonymous clients allowed, role left at its default: each is the
	// device its client id names, no more.
	cfg = testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ACL.AnonymousRole = c.MQTT.ACL.AnonymousRole
	gw, stop = runGateway(t, cfg)
	anon, code := dialV5(t, dial(t, gw.Addr()), "dev-a", "", "")
	if code != 0 {
		t.Fatalf("anonymous CONNECT with allow_anonymous: %#x", code)
	}
	for _, tc := range []struct {
		topic string
		want  byte
	}{
		{"sensors/dev-a/temp", 0},
		{"sensors/dev-b/temp", 0x87},
		{"other/topic", 0x87},
	} {
		if got := anon.publish(uint16(len(tc.topic)), tc.topic, "1"); got != tc.want {
			t.Errorf("anonymous dev-a publishing to %s: PUBACK %#x, want %#x", tc.topic, got, tc.want)
		}
	}
	if got := anon.subscribe(1, "#"); got != 0x87 {
		t.Errorf("anonymous dev-a subscribing to #: SUBACK %#x, want 0x87", got)
	}
}

// TestWebSocketListener: MQTT over WebSocket reaches the same broker,
// with the same authentication, and its readings are aggregated.
func TestWebSocketListener(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = false
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dev-ws": "pw"})
	cfg.MQTT.WebSocket.Listen = fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	gw, stop := runGateway(t, cfg)
	defer stop()
	var ws *websocket.Conn
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		var err error
		ws, _, err = (&websocket.Dialer{Subprotocols: []string{"mqtt"}}).Dial("ws://"+gw.WebSocketAddr()+"/", nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	defer ws.Close()
	roundTrip := func(cp *packets.ControlPacket) *packets.ControlPacket {
		t.Helper()
		var b bytes.Buffer
		cp.WriteTo(&b)
		if err := ws.WriteMessage(websocket.BinaryMessage, b.Bytes()); err != nil {
			t.Fatal(err)
		}
		ws.SetReadDeadline(time.Now().Add(patience))
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := packets.ReadPacket(bytes.NewReader(msg))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ack := roundTrip(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT},
		Content: &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "dev-ws", CleanStart: true, KeepAlive: 30,
			UsernameFlag: true, Username: "dev-ws", PasswordFlag: true, Password: []byte("pw"), Properties: &packets.Properties{}}})
	if ca, ok := ack.Content.(*packets.Connack); !ok || ca.ReasonCode != 0 {
		t.Fatalf("CONNACK %v", ack)
	}
	pa := roundTrip(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2},
		Content: &packets.Publish{QoS: 1, PacketID: 1, Topic: "sensors/dev-ws/temp", Payload: []byte("3"), Properties: &packets.Properties{}}})
	if p, ok := pa.Content.(*packets.Puback); !ok || p.ReasonCode != 0 {
		t.Fatalf("PUBACK %v", pa)
	}
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.Outcomes["aggregated"] == 1 }); st.Outcomes["aggregated"] != 1 {
		t.Errorf("aggregated %d, want 1", st.Outcomes["aggregated"])
	}
}

// TestWebSocketOrigin: a browser page from an origin not in
// mqtt.websocket.allowed_origins cannot open the WebSocket (HTTP 403,
// counted), one from a listed origin can, and so can a client that sends
// no Origin (not a browser).
func TestWebSocketOrigin(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"}) // anonymous admins: what a page on the LAN would get
	cfg.MQTT.WebSocket.Listen = fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	cfg.MQTT.WebSocket.AllowedOrigins = []string{"https://dash.example.com"}
	gw, stop := runGateway(t, cfg)
	defer stop()
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", gw.WebSocketAddr())
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, origin string
		want         int // HTTP status of the handshake
	}{
		{"no origin", "", 101},
		{"listed origin", "https://dash.example.com", 101},
		{"listed origin, other case", "HTTPS://Dash.Example.com", 101},
		{"other origin", "http://evil.example.com", 403},
		{"listed host, other scheme", "http://dash.example.com", 403},
		{"the gateway's own address", "http://" + gw.WebSocketAddr(), 403}, // DNS rebinding makes any page look so
	} {
		h := http.Header{}
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		ws, resp, err := (&websocket.Dialer{Subprotocols: []string{"mqtt"}}).Dial("ws://"+gw.WebSocketAddr()+"/", h)
		if resp == nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.StatusCode != tc.want {
			t.Errorf("%s: handshake status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		if ws != nil {
			var b bytes.Buffer
			(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT}, Content: &packets.Connect{ProtocolName: "MQTT",
				ProtocolVersion: 5, ClientID: "ws-" + strings.ReplaceAll(tc.name, " ", "-"), CleanStart: true, KeepAlive: 30, Properties: &packets.Properties{}}}).WriteTo(&b)
			ws.WriteMessage(websocket.BinaryMessage, b.Bytes())
			ws.SetReadDeadline(time.Now().Add(patience))
			if _, msg, err := ws.ReadMessage(); err != nil || len(msg) < 4 || msg[0] != 0x20 || msg[3] != 0 {
				t.Errorf("%s: CONNACK %x (%v), want success", tc.name, msg, err)
			}
			ws.Close()
		}
	}
	if n := refused(t, gw, "websocket_origin", 3); n != 3 {
		t.Errorf("websocket_origin refusals %d, want 3", n)
	}
}

// TestCertificateNamespace: certificate names and usernames are separate
// namespaces for roles. A certificate whose name is that of an admin user
// is a device; a certificate gets another role only through
// mqtt.acl.certificates, which gives usernames nothing.
func TestCertificateNamespace(t *testing.T) {
	ca := testpki.New(t, "ns-ca")
	cfg := secureConfig(t, ca) // ops is an admin user
	cfg.MQTT.ACL.Certificates = map[string]string{"dash-cert": "subscriber"}
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"ops": "pw-o", "dash-cert": "pw-c"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	withCert := func(cn string) *v5 {
		_, _, pair := ca.Issue(cn, false)
		conn, err := tls.Dial("tcp", gw.TLSAddr(), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
		if err != nil {
			t.Fatal(err)
		}
		c, code := dialV5(t, conn, cn+":cert", "", "")
		if code != 0 {
			t.Fatalf("certificate %s: CONNACK %#x", cn, code)
		}
		return c
	}
	opsCert, dashCert := withCert("ops"), withCert("dash-cert")
	dashUser, code := dialV5(t, dial(t, gw.Addr()), "dash-cert:user", "dash-cert", "pw-c")
	if code != 0 {
		t.Fatalf("user dash-cert: CONNACK %#x", code)
	}
	for _, tc := range []struct {
		name  string
		c     *v5
		topic string
		want  byte
	}{
		{"certificate ops under another device", opsCert, "sensors/dev-2/temp", 0x87},
		{"certificate ops anywhere", opsCert, "other/topic", 0x87},
		{"certificate ops to its own readings", opsCert, "sensors/ops/temp", 0},
		{"certificate dash-cert (subscriber)", dashCert, "sensors/dash-cert/temp", 0x87},
		{"user dash-cert (a device)", dashUser, "sensors/dash-cert/temp", 0},
	} {
		if got := tc.c.publish(uint16(len(tc.name)), tc.topic, "1"); got != tc.want {
			t.Errorf("%s: PUBACK %#x, want %#x", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name   string
		c      *v5
		filter string
		want   byte
	}{
		{"certificate ops to #", opsCert, "#", 0x87},
		{"certificate dash-cert to readings", dashCert, "sensors/+/+", 1},
		{"user dash-cert to readings", dashUser, "sensors/+/+", 0x87},
	} {
		if got := tc.c.subscribe(uint16(len(tc.name)), tc.filter); got != tc.want {
			t.Errorf("%s: SUBACK %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

// TestWebSocketClientCertificate: over wss:// a verified client
// certificate names the client as it does on the TLS listener (the
// identity is read through the WebSocket and write-deadline wrappers).
func TestWebSocketClientCertificate(t *testing.T) {
	ca := testpki.New(t, "test-ca")
	cfg := secureConfig(t, ca)
	cfg.MQTT.WebSocket.Listen = fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
	cfg.MQTT.WebSocket.TLS = true
	gw, stop := runGateway(t, cfg)
	defer stop()
	_, _, pair := ca.Issue("dev-ws", false)
	d := &websocket.Dialer{Subprotocols: []string{"mqtt"}, TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}}}
	var ws *websocket.Conn
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if ws, _, err = d.Dial("wss://"+gw.WebSocketAddr()+"/", nil); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	defer ws.Close()
	var b bytes.Buffer
	(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT},
		Content: &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "dev-ws", CleanStart: true, KeepAlive: 30,
			Properties: &packets.Properties{}}}).WriteTo(&b)
	if err := ws.WriteMessage(websocket.BinaryMessage, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	ws.SetReadDeadline(time.Now().Add(patience))
	_, msg, err := ws.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := packets.ReadPacket(bytes.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	if ca, ok := cp.Content.(*packets.Connack); !ok || ca.ReasonCode != 0 {
		t.Fatalf("CONNACK over wss with the certificate of dev-ws: %+v, want success (no username, anonymous off)", cp.Content)
	}
}
