package gateway_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
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

// TestClientThatNeverReads: a 3.1.1 client with keep alive 0 sends QoS 1
// publications among thousands of PINGREQs and never reads, while a
// well-behaved device publishes all along. Once the gateway's writes to
// the reader block for good, the reader is disconnected when a write has
// waited mqtt.write_timeout, and counted as write_timeout; meanwhile the
// device's PUBACKs keep coming, each well within the timeout.
//
// When the socket is full for good is known only afterwards: a write that
// waits a while can still go through (the kernel grows the socket's send
// buffer in steps), and a loaded machine pauses the gateway as long. (The
// test used to take 500 ms without progress for it, and measured then.)
// The write that timed out began write_timeout before the disconnect: the
// device's PUBACKs in that span are the measurement.
func TestClientThatNeverReads(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a socket with two million PINGREQs")
	}
	// mqtt.write_timeout at its default: a PUBACK held behind the reader
	// would wait for it, far longer than goodWithin.
	const writeTimeout, goodWithin = 10 * time.Second, 3 * time.Second
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.WriteTimeout = configs.Duration(writeTimeout)
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

	// The good device publishes every 20 ms, each publication once the
	// previous one's PUBACK came, until the attacker is gone: all through
	// the flood, which takes a minute or more on a loaded machine (a
	// device silent for that long would outlive its keep alive).
	type sample struct {
		sent, acked time.Time
		err         error
	}
	var samples []sample // read once goodDone is closed
	stopGood, goodDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(goodDone)
		for i := 0; ; i++ {
			select {
			case <-stopGood:
				return
			case <-time.After(20 * time.Millisecond):
			}
			pid := uint16(2 + i%60_000)
			s := sample{sent: time.Now()}
			cp := &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2},
				Content: &packets.Publish{QoS: 1, PacketID: pid, Topic: "sensors/good/t", Payload: []byte("1"), Properties: &packets.Properties{}}}
			if _, s.err = cp.WriteTo(good.conn); s.err == nil {
				good.conn.SetReadDeadline(s.sent.Add(writeTimeout + 30*time.Second)) // only a hang ends it
				var ack *packets.ControlPacket
				if ack, s.err = packets.ReadPacket(good.conn); s.err == nil {
					if a, ok := ack.Content.(*packets.Puback); !ok || a.PacketID != pid || a.ReasonCode != 0 {
						s.err = fmt.Errorf("publication %d: got %v, want its PUBACK", pid, ack)
					}
				}
			}
			s.acked = time.Now()
			samples = append(samples, s)
			if s.err != nil {
				return
			}
		}
	}()
	goodStopped := false
	stopGoodDevice := func() {
		if !goodStopped {
			goodStopped = true
			close(stopGood)
			<-goodDone
		}
	}
	defer stopGoodDevice()

	// The attacker keeps the kernel's default receive buffer: 128 KiB
	// while it reads nothing. A small fixed one (SO_RCVBUF) can wedge the
	// connection itself when the gateway reads slowly, on a loaded
	// machine: Linux then leaves both sides' windows shut, the gateway
	// waiting to read and the attacker to write, with no write pending
	// for the timeout to end. (A standalone echo over loopback, its
	// reader pausing now and then, stuck in most runs with 1 KiB, in 3 of
	// 24 with 64 KiB, in none of 48 with the default; so did this test,
	// with 1 KiB, at 127 KB out.)
	attacker := dial(t, addr)
	attacker.Write(v3KeepAliveZero("never-reads"))
	if f, err := readFrame(attacker); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("attacker CONNACK %x (%v)", f, err)
	}
	// Publications among PINGREQs, until the gateway stops reading: its
	// PINGRESPs fill the socket (the kernel's send buffer grows to a few
	// MB first), and it disconnects the attacker. A publication every 100
	// PINGREQs: when the socket fills for good, PUBACKs of the last ones
	// are due (an fsync takes far longer than 100 PINGRESPs), and what
	// writes them must not hold up anyone else's while it waits for the
	// attacker's lock (the reader holds it, blocked in its write). With
	// one every 10,000 (before), often none was due then.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer attacker.Close()
	wg.Go(func() {
		chunk := make([]byte, 0, 23_000)
		for i := 0; ; {
			chunk = chunk[:0]
			for range 100 {
				chunk = append(chunk, v3Publish(uint16(i%60_000+1), "sensors/attacker/t", "1")...)
				i++
				for range 100 {
					chunk = append(chunk, 0xc0, 0) // PINGREQ
				}
			}
			if _, err := attacker.Write(chunk); err != nil {
				return // closed
			}
		}
	})

	// Wait for the disconnect, noting when the gateway last sent the
	// attacker anything: the time of the read of BytesOut before the one
	// that saw it grow. (BytesOut is what mochi writes, the attacker's
	// PINGRESPs; the good device's PUBACKs are the journal's, and a few
	// bytes between two reads are not taken for the attacker's.)
	var (
		disconnected time.Time // at or after the write that timed out failed
		lastOut      int64     // BytesOut as last seen
		outAfter     time.Time // the attacker's last bytes went out after this
	)
	lastOut, outAfter = gw.Stats().BytesOut, time.Now()
	prevRead := outAfter
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		readAt := time.Now()
		st := gw.Stats()
		if st.BytesOut > lastOut+64 {
			outAfter = prevRead
		}
		lastOut, prevRead = st.BytesOut, readAt
		if st.MQTTRefused["write_timeout"] > 0 {
			disconnected = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attacker was not disconnected in 3 minutes: %d bytes out to it, %d publications; clients %d", lastOut, st.Publishes, st.Clients)
		}
	}
	stopGoodDevice()
	t.Logf("stalled after %d bytes out to the attacker; disconnected %v later", lastOut, disconnected.Sub(outAfter).Round(time.Millisecond))

	// The attacker's socket was full, and a write to it waited, from
	// writeTimeout before the disconnect until the disconnect, which is
	// seen a little after it happens: the span checked is that, less a
	// second at its end. (Every PUBACK is checked that overlaps it.)
	from, to := disconnected.Add(-writeTimeout+500*time.Millisecond), disconnected.Add(-time.Second)
	var worst time.Duration
	n := 0
	for _, s := range samples {
		if s.err != nil {
			t.Errorf("good device, publication sent %v before the attacker's disconnect: %v", disconnected.Sub(s.sent).Round(time.Millisecond), s.err)
			continue
		}
		if s.acked.Before(from) || s.sent.After(to) {
			continue
		}
		if d := s.acked.Sub(s.sent); d > goodWithin {
			t.Errorf("good device, publication sent %v before the attacker's disconnect: PUBACK after %v, want within %v",
				disconnected.Sub(s.sent).Round(time.Millisecond), d.Round(time.Millisecond), goodWithin)
		}
		worst = max(worst, s.acked.Sub(s.sent))
		if !s.sent.Before(from) && !s.acked.After(to) {
			n++
		}
	}
	t.Logf("good device: %d PUBACKs while the attacker's socket was full, slowest %v", n, worst)
	if n < 5 {
		t.Errorf("good device: %d PUBACKs in the %v before the attacker's disconnect, want them coming all along", n, to.Sub(from))
	}

	// The attacker is disconnected once a write has waited write_timeout:
	// not before (the gateway sent it nothing for that long).
	if got := refused(t, gw, "write_timeout", 1); got != 1 {
		t.Errorf("write_timeout refusals %d, want 1", got)
	}
	if took := disconnected.Sub(outAfter); took < writeTimeout-500*time.Millisecond {
		t.Errorf("attacker disconnected %v after the gateway last sent it anything, before mqtt.write_timeout (%v)", took, writeTimeout)
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

// TestPacketIDReuseSameValue: firmware that always uses packet id 1 sends
// 21.5, has its PUBACK, and sends 21.5 again with id 1 (a new reading);
// that copy is lost with the connection, and the device resends it with
// DUP once it is back. The gateway knows the first PUBACK reached the
// device (its TCP acknowledged it, and the connection lasted on), so the
// resend is the second reading, not a duplicate of the first. (Before, a
// DUP with the content of the id's latest publication was always taken
// for a resend: aggregated 1, duplicates 1.) A resend whose first copy
// the gateway did journal is still a duplicate.
func TestPacketIDReuseSameValue(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-same/t"
	c, _ := rawConnect(t, gw.Addr(), "dev-same", true)
	c.publish(1, false, topic, "21.5")
	if st := settled(t, gw, func(st gateway.Stats) bool { return st.AcksReceived >= 1 }); st.AcksReceived < 1 {
		t.Fatal("the gateway never learnt that the device received its PUBACK")
	}
	c.conn.Close() // the second 21.5, sent now, is lost with it
	c, present := rawConnect(t, gw.Addr(), "dev-same", false)
	if !present {
		t.Fatal("session not present")
	}
	c.publish(1, true, topic, "21.5") // the second reading, resent
	c.publish(1, true, topic, "21.5") // its PUBACK lost, say: resent again
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	st := settled(t, gw, func(st gateway.Stats) bool { return counted(st)+st.Duplicates >= 3 })
	if counted(st) != 2 || st.Duplicates != 1 {
		t.Errorf("counted %d readings, %d duplicates; want 2, 1", counted(st), st.Duplicates)
	}
}

// TestReceiveMaximumFlowControl: a client with more QoS 1 publications in
// flight than mqtt.receive_maximum (a 3.1.1 client without a window, or
// an MQTT 5 one that ignores the CONNACK's) is not disconnected: the
// gateway stops reading its socket until PUBACKs are written, and TCP
// slows it down. All nine of a burst past a receive maximum of 8 are
// acknowledged, in order, and counted once.
func TestReceiveMaximumFlowControl(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ReceiveMaximum = 8
	// The nine are read long before the next fsync: the ninth waits.
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
	for pid := uint16(2); pid <= 10; pid++ {
		c.conn.SetReadDeadline(time.Now().Add(patience))
		cp, err := packets.ReadPacket(c.conn)
		if err != nil {
			t.Fatalf("waiting for PUBACK %d: %v", pid, err)
		}
		if a, ok := cp.Content.(*packets.Puback); !ok || a.PacketID != pid || a.ReasonCode != 0 {
			t.Fatalf("got %v, want PUBACK %d", cp, pid)
		}
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Outcomes["aggregated"] >= 10 })
	if st.Outcomes["aggregated"] != 10 || st.FlowHeld == 0 || st.MQTTRefused["receive_maximum"] != 0 {
		t.Errorf("aggregated %d, held %d, receive_maximum refusals %d; want 10, at least 1, 0",
			st.Outcomes["aggregated"], st.FlowHeld, st.MQTTRefused["receive_maximum"])
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
	start := time.Now()
	flood.Write(bytes.Repeat([]byte{0xc0, 0}, 1000))
	flood.SetReadDeadline(time.Now().Add(patience))
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
	// The burst, and the tokens refilled (1/s) while the gateway read the
	// flood: a token or two, more only if a loaded machine made that slow.
	if most := max(12, 10+int(time.Since(start).Seconds()*cfg.MQTT.PingRate)+1); pongs > most {
		t.Errorf("%d PINGRESPs before the disconnect, want at most the burst (10) and a token or two (%d)", pongs, most)
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

// TestAcksCarryNoUserProperties: an MQTT 5 PUBACK or PUBREC carries no
// copy of its PUBLISH's user properties (mochi echoes them unless told
// not to): 4 bytes whatever the publication carried, whether the journal
// or mochi writes it (retained, QoS 2).
func TestAcksCarryNoUserProperties(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	c, code := dialV5(t, dial(t, gw.Addr()), "props-1", "", "")
	if code != 0 {
		t.Fatalf("CONNACK %#x", code)
	}
	user := []packets.User{{Key: "firmware", Value: "v2.3.1-build-7781"}, {Key: "site", Value: "hall-4"}}
	for i, tc := range []struct {
		qos    byte
		retain bool
	}{{1, false}, {1, true}, {2, false}} {
		pid := uint16(i + 1)
		cp := &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH},
			Content: &packets.Publish{QoS: tc.qos, Retain: tc.retain, PacketID: pid, Topic: "sensors/props-1/t", Payload: []byte("1"),
				Properties: &packets.Properties{User: user}}}
		if _, err := cp.WriteTo(c.conn); err != nil {
			t.Fatal(err)
		}
		f, err := readFrame(c.conn)
		if err != nil {
			t.Fatal(err)
		}
		if len(f) != 3 || f[1] != 0 || f[2] != byte(pid) { // type, packet id: the 4 bytes of a bare one
			t.Errorf("QoS %d retained %v: acknowledged with %x (type and body), want a bare one", tc.qos, tc.retain, f)
		}
		if tc.qos == 2 {
			rel := &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBREL, Flags: 2}, Content: &packets.Pubrel{PacketID: pid, Properties: &packets.Properties{}}}
			if _, err := rel.WriteTo(c.conn); err != nil {
				t.Fatal(err)
			}
			if f, err := readFrame(c.conn); err != nil || f[0]>>4 != packets.PUBCOMP {
				t.Errorf("PUBCOMP: %x %v", f, err)
			}
		}
	}
}

// TestResendWithoutDup: MQTT.js (5.x) resends its unacknowledged
// publications after a reconnect with their packet ids but without DUP
// [against MQTT-3.3.1-1]. A publication without DUP whose packet id and
// content are those of one from an earlier connection, whose PUBACK the
// client may not have had, is taken for its resend; on the connection
// itself such a publication is new (firmware with one packet id repeats
// values).
func TestResendWithoutDup(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/js-1/t"
	counted := func(st gateway.Stats) uint64 { return st.Outcomes["aggregated"] + st.Outcomes["late_revised"] }
	c, _ := rawConnect(t, gw.Addr(), "js-1", true)
	for pid := uint16(1); pid <= 5; pid++ {
		cp := packets.NewControlPacket(packets.PUBLISH)
		cp.Content = &packets.Publish{QoS: 1, PacketID: pid, Topic: topic, Payload: []byte(fmt.Sprint(pid)), Properties: &packets.Properties{}}
		c.send(cp)
	}
	c.conn.Close() // before the PUBACKs: the client never has them
	if st := settled(t, gw, func(st gateway.Stats) bool { return counted(st) >= 5 }); counted(st) != 5 {
		t.Fatalf("counted %d, want 5", counted(st))
	}
	c, present := rawConnect(t, gw.Addr(), "js-1", false)
	if !present {
		t.Fatal("session not present")
	}
	for pid := uint16(1); pid <= 5; pid++ {
		if rc := c.publish(pid, false, topic, fmt.Sprint(pid)); rc != 0 { // resent, DUP not set
			t.Fatalf("resend %d: PUBACK %#x", pid, rc)
		}
	}
	c.publish(1, false, topic, "1") // a new reading, same id and value
	st := settled(t, gw, func(st gateway.Stats) bool { return counted(st)+st.Duplicates >= 11 })
	if counted(st) != 6 || st.Duplicates != 5 {
		t.Errorf("counted %d, duplicates %d; want 6 (five and the new one), 5 (the resends)", counted(st), st.Duplicates)
	}
}
