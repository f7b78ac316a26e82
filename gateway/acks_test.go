package gateway_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// v3KeepAliveZero is a 3.1.1 CONNECT with a clean session and keep alive
// 0: mochi then sets no deadline on the socket at all.
func v3KeepAliveZero(id string) []byte {
	body := append(mqttString("MQTT"), 4, 0x02, 0, 0)
	return frame(0x10, append(body, mqttString(id)...))
}

// dialSmallReceiveBuffer connects with the smallest receive buffer the
// kernel allows, so that what the gateway writes fills the socket at once.
func dialSmallReceiveBuffer(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestClientThatNeverReads: a 3.1.1 client with keep alive 0 and a tiny
// receive buffer sends QoS 1 publications among thousands of PINGREQs and
// never reads. While its socket is full (and it is still connected), a
// well-behaved device's PUBACKs keep coming within a second; the reader
// is disconnected once a write to it has waited mqtt.write_timeout, and
// counted as write_timeout.
func TestClientThatNeverReads(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a socket with 800,000 PINGREQs")
	}
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.WriteTimeout = configs.Duration(3 * time.Second)
	cfg.MQTT.PingRate = 0 // the PINGRESPs are what fill the socket here (TestPingFlood: by default the flood ends sooner)
	// PUBACKs lag the reads by a batch, so that some of the attacker's are
	// due once its socket is full.
	cfg.Storage.FsyncInterval = configs.Duration(20 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()

	good, code := dialV5(t, dial(t, addr), "good", "", "")
	if code != 0 {
		t.Fatalf("CONNACK %#x", code)
	}
	if rc := good.publish(1, "sensors/good/t", "1"); rc != 0 {
		t.Fatalf("PUBACK %#x", rc)
	}

	attacker := dialSmallReceiveBuffer(t, addr)
	attacker.Write(v3KeepAliveZero("never-reads"))
	if f, err := readFrame(attacker); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("attacker CONNACK %x (%v)", f, err)
	}
	// Publications among PINGREQs, until the gateway stops reading: its
	// PINGRESPs fill the socket (the kernel's send buffer grows to 4 MB
	// first), and what it has sent stops growing.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer attacker.Close()
	var chunks atomic.Int64
	wg.Go(func() {
		chunk := make([]byte, 0, 20_100)
		for i := 0; ; i++ {
			chunk = append(chunk[:0], v3Publish(uint16(i%60_000+1), "sensors/attacker/t", "1")...)
			for range 10_000 {
				chunk = append(chunk, 0xc0, 0) // PINGREQ
			}
			if _, err := attacker.Write(chunk); err != nil {
				return // closed
			}
			chunks.Add(1)
		}
	})
	// Stalled: for 500 ms the gateway has neither sent anything nor read
	// another chunk.
	progress := func() int64 { return gw.Stats().BytesOut + chunks.Load() }
	last, since := progress(), time.Now()
	for deadline := time.Now().Add(90 * time.Second); time.Since(since) < 500*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatal("the gateway's writes to the attacker never stalled")
		}
		time.Sleep(10 * time.Millisecond)
		if n := progress(); n != last {
			last, since = n, time.Now()
		}
	}
	stalled := since
	t.Logf("stalled after %d bytes out, %d publications", gw.Stats().BytesOut, gw.Stats().Publishes)

	// For a second, the good device publishes: every PUBACK within 1 s.
	var worst time.Duration
	n := 0
	for pid := uint16(2); time.Since(stalled) < 1500*time.Millisecond; pid++ {
		start := time.Now()
		good.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2},
			Content: &packets.Publish{QoS: 1, PacketID: pid, Topic: "sensors/good/t", Payload: []byte("1"), Properties: &packets.Properties{}}})
		good.conn.SetReadDeadline(start.Add(time.Second))
		cp, err := packets.ReadPacket(good.conn)
		if err != nil {
			t.Fatalf("good device, publication %d, %v after the attacker's socket filled: no PUBACK within 1 s (%v)", pid, start.Sub(stalled), err)
		}
		if ack, ok := cp.Content.(*packets.Puback); !ok || ack.PacketID != pid || ack.ReasonCode != 0 {
			t.Fatalf("good device, publication %d: got %v", pid, cp)
		}
		worst = max(worst, time.Since(start))
		n++
	}
	if st := gw.Stats(); st.Clients != 2 || st.MQTTRefused["write_timeout"] != 0 {
		t.Fatalf("while measuring: %d clients, %d write timeouts; want the attacker still connected (2, 0)", st.Clients, st.MQTTRefused["write_timeout"])
	}
	t.Logf("good device: %d PUBACKs while the attacker's socket was full, slowest %v", n, worst)

	// The attacker is disconnected once a write has waited write_timeout.
	for deadline := time.Now().Add(30 * time.Second); gw.Stats().MQTTRefused["write_timeout"] == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := refused(t, gw, "write_timeout", 1); got != 1 {
		t.Errorf("write_timeout refusals %d, want 1", got)
	}
	if took := time.Since(stalled); took < 2900*time.Millisecond {
		t.Errorf("attacker disconnected %v after its socket filled, before mqtt.write_timeout (3s)", took)
	}
	if !closed(attacker) {
		t.Error("attacker still connected")
	}
	if rc := good.publish(1000, "sensors/good/t", "1"); rc != 0 {
		t.Errorf("after the attacker left: PUBACK %#x", rc)
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Clients == 1 })
	if st.Clients != 1 {
		t.Errorf("%d clients connected, want the good device only", st.Clients)
	}
}

// TestPacketIDReuse: firmware with one publication in flight uses packet
// id 1 for every reading. A DUP publication is a resend of the latest
// publication with its packet id only: once a publication without DUP
// has reused the id, a DUP with the content of an older one is a new
// reading whose first copy was lost, not a duplicate.
func TestPacketIDReuse(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-one/t"
	c, _ := rawConnect(t, gw.Addr(), "dev-one", true)
	c.publish(1, false, topic, "21.5") // reading A
	c.publish(1, false, topic, "22")   // reading B: A was acknowledged
	c.publish(1, true, topic, "21.5")  // reading C (first copy lost), resent
	c.publish(1, true, topic, "21.5")  // C's PUBACK lost: resent again
	c.publish(1, false, topic, "21.5") // reading D, the same value as C
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	st := settled(t, gw, func(st gateway.Stats) bool { return counted(st)+st.Duplicates >= 5 })
	if counted(st) != 4 || st.Duplicates != 1 {
		t.Errorf("counted %d readings, %d duplicates; want 4 (A, B, C, D), 1 (C's resend)", counted(st), st.Duplicates)
	}
}

// TestReceiveMaximumQoS1: QoS 1 publications the journal acknowledges
// count against mqtt.receive_maximum like those mochi acknowledges: the
// ninth in flight with a receive maximum of 8 gets DISCONNECT 0x93, so a
// client never has more in flight than the duplicate ring holds.
func TestReceiveMaximumQoS1(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ReceiveMaximum = 8
	// The nine are read long before the next fsync: none is acknowledged.
	cfg.Storage.FsyncInterval = configs.Duration(time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	c, code := dialV5(t, dial(t, gw.Addr()), "greedy-1", "", "")
	if code != 0 {
		t.Fatalf("CONNACK %#x", code)
	}
	if rc := c.publish(1, "sensors/greedy-1/t", "1"); rc != 0 { // the journal has just synced
		t.Fatalf("PUBACK %#x", rc)
	}
	var burst bytes.Buffer
	for pid := uint16(2); pid <= 10; pid++ {
		cp := &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2},
			Content: &packets.Publish{QoS: 1, PacketID: pid, Topic: "sensors/greedy-1/t", Payload: []byte("1"), Properties: &packets.Properties{}}}
		if _, err := cp.WriteTo(&burst); err != nil {
			t.Fatal(err)
		}
	}
	c.conn.Write(burst.Bytes())
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	cp, err := packets.ReadPacket(c.conn)
	if err != nil {
		t.Fatalf("want DISCONNECT 0x93, got %v", err)
	}
	if d, ok := cp.Content.(*packets.Disconnect); !ok || d.ReasonCode != 0x93 {
		t.Fatalf("want DISCONNECT 0x93, got %v", cp)
	}
	if !closed(c.conn) {
		t.Error("connection still open after DISCONNECT")
	}
	if got := refused(t, gw, "receive_maximum", 1); got != 1 {
		t.Errorf("receive_maximum refusals %d, want 1", got)
	}
}

// TestQoS2CompleteIsDurable: once a client has PUBCOMP, the end of its
// QoS 2 exchange is on disk. The data directory copied at that moment is
// what a crash then would leave; a gateway started on it must not hold
// the exchange open, or the client's next QoS 2 publication with the same
// packet id would get PUBREC ("in use"; a 3.1.1 client sees success)
// without being journaled.
func TestQoS2CompleteIsDurable(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	// The PUBREL comes well within a second of the publication's fsync.
	cfg.Storage.FsyncInterval = configs.Duration(time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer func() { stop() }()
	const topic = "sensors/dev-q2c/t"
	publish := func(c *rawClient, payload string) {
		t.Helper()
		pub := packets.NewControlPacket(packets.PUBLISH)
		pub.Content = &packets.Publish{QoS: 2, PacketID: 5, Topic: topic, Payload: []byte(payload), Properties: &packets.Properties{}}
		c.send(pub)
		if rc := c.expect(packets.PUBREC, 5); rc != 0 {
			t.Fatalf("PUBREC reason %#x", rc)
		}
		rel := packets.NewControlPacket(packets.PUBREL)
		rel.Content = &packets.Pubrel{PacketID: 5, Properties: &packets.Properties{}}
		c.send(rel)
		if rc := c.expect(packets.PUBCOMP, 5); rc != 0 {
			t.Fatalf("PUBCOMP reason %#x", rc)
		}
	}
	c, _ := rawConnect(t, gw.Addr(), "dev-q2c", true)
	publish(c, "7")
	// The crash, as the client has its PUBCOMP: what is on disk now.
	crashed := t.TempDir()
	if err := os.CopyFS(crashed, os.DirFS(cfg.Gateway.DataDir)); err != nil {
		t.Fatal(err)
	}
	c.conn.Close()
	stop()

	cfg.Gateway.DataDir = crashed
	gw, stop = runGateway(t, cfg)
	c, present := rawConnect(t, gw.Addr(), "dev-q2c", false)
	if !present {
		t.Fatal("session not present after the crash")
	}
	publish(c, "8") // a new reading, packet id 5 again
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	if st := settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 2 }); counted(st) != 2 {
		t.Errorf("counted %d readings (all time), want 2: the one before the crash and the one after", counted(st))
	}
}

// TestQoS2NewPublicationEndsStaleExchange: a QoS 2 publication without DUP
// that reuses the packet id of an exchange the gateway still holds open
// (its PUBREL never came, or the exchange was restored stale) is a new
// publication: the client has moved on. It is journaled and counted,
// where mochi would answer PUBREC "packet identifier in use" (success to
// a 3.1.1 client) and drop it.
func TestQoS2NewPublicationEndsStaleExchange(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-q2s/t"
	pub := func(payload string) *packets.ControlPacket {
		cp := packets.NewControlPacket(packets.PUBLISH)
		cp.Content = &packets.Publish{QoS: 2, PacketID: 6, Topic: topic, Payload: []byte(payload), Properties: &packets.Properties{}}
		return cp
	}
	c, _ := rawConnect(t, gw.Addr(), "dev-q2s", true)
	c.send(pub("1"))
	if rc := c.expect(packets.PUBREC, 6); rc != 0 {
		t.Fatalf("PUBREC reason %#x", rc)
	}
	c.conn.Close() // no PUBREL
	c, _ = rawConnect(t, gw.Addr(), "dev-q2s", false)
	if rc := c.expect(packets.PUBREC, 6); rc != 0 { // resent on resume
		t.Fatalf("resent PUBREC reason %#x", rc)
	}
	c.send(pub("2")) // no DUP: a new publication
	if rc := c.expect(packets.PUBREC, 6); rc != 0 {
		t.Fatalf("new publication with packet id 6: PUBREC reason %#x, want success", rc)
	}
	rel := packets.NewControlPacket(packets.PUBREL)
	rel.Content = &packets.Pubrel{PacketID: 6, Properties: &packets.Properties{}}
	c.send(rel)
	if rc := c.expect(packets.PUBCOMP, 6); rc != 0 {
		t.Errorf("PUBCOMP reason %#x", rc)
	}
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	if st := settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 2 }); counted(st) != 2 {
		t.Errorf("counted %d readings, want 2", counted(st))
	}
}

// TestPubackOrder: a client's PUBACKs follow the order of its
// publications [MQTT-4.6.0-2], whether the journal writes them (QoS 1,
// not retained) or mochi does (retained: it stores the message first).
func TestPubackOrder(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	c, code := dialV5(t, dial(t, gw.Addr()), "orderly", "", "")
	if code != 0 {
		t.Fatalf("CONNACK %#x", code)
	}
	pid := uint16(0)
	for round := range 50 {
		var burst bytes.Buffer
		for i := range 4 {
			pid++
			flags := byte(2)
			if i == 3 {
				flags |= 1 // retained: acknowledged by mochi
			}
			cp := &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: flags},
				Content: &packets.Publish{QoS: 1, Retain: flags&1 != 0, PacketID: pid, Topic: "sensors/orderly/t", Payload: []byte("1"), Properties: &packets.Properties{}}}
			if _, err := cp.WriteTo(&burst); err != nil {
				t.Fatal(err)
			}
		}
		c.conn.Write(burst.Bytes())
		for want := pid - 3; want <= pid; want++ {
			ack, ok := c.read().Content.(*packets.Puback)
			if !ok || ack.PacketID != want {
				t.Fatalf("round %d: got %v, want PUBACK %d", round, ack, want)
			}
		}
	}
}

// TestPingFlood: a client that sends PINGREQs faster than
// mqtt.ping_rate_per_client (a client pings once per keep alive) is
// disconnected and counted, while one that pings within it stays.
func TestPingFlood(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()

	calm := dial(t, addr)
	calm.Write(v3KeepAliveZero("calm"))
	if f, err := readFrame(calm); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("calm CONNACK %x (%v)", f, err)
	}
	for range 5 { // within the burst
		calm.Write([]byte{0xc0, 0})
		if f, err := readFrame(calm); err != nil || f[0] != 0xd0 {
			t.Fatalf("calm client: PINGRESP %x (%v)", f, err)
		}
	}

	flood := dial(t, addr)
	flood.Write(v3KeepAliveZero("flood"))
	if f, err := readFrame(flood); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("flood CONNACK %x (%v)", f, err)
	}
	flood.Write(bytes.Repeat([]byte{0xc0, 0}, 1000))
	flood.SetReadDeadline(time.Now().Add(5 * time.Second))
	pongs := 0
	for {
		f, err := readFrame(flood)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the flooding client is still connected after %d PINGRESPs", pongs)
			}
			break // closed by the gateway
		}
		if f[0] == 0xd0 {
			pongs++
		}
	}
	if pongs > 12 {
		t.Errorf("%d PINGRESPs before the disconnect, want at most the burst (10) and a token or two", pongs)
	}
	if n := refused(t, gw, "ping_rate", 1); n != 1 {
		t.Errorf("ping_rate refusals %d, want 1", n)
	}
	// The calm client is still there.
	calm.Write([]byte{0xc0, 0})
	if f, err := readFrame(calm); err != nil || f[0] != 0xd0 {
		t.Fatalf("calm client after the flood: PINGRESP %x (%v)", f, err)
	}
}
