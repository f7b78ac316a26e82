package gateway_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// aggregatedCount is every reading counted, in time or revising a window.
func aggregatedCount(st gateway.Stats) uint64 {
	return st.Outcomes["aggregated"] + st.Outcomes["late_revised"]
}

// TestAttackShortConnectionLosesReading: TestPacketIDReuseSameValue with
// a sleepy device: it wakes, connects, publishes one reading with packet
// id 1, has its PUBACK and sends DISCONNECT within the second, as battery
// devices do. Its next wake's reading, the same value with id 1, is lost
// with the connection; the device resends it with DUP on its next wake.
// The DISCONNECT told the gateway that the first PUBACK was received, so
// the resend is the second reading, not a duplicate of the first.
func TestAttackShortConnectionLosesReading(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-sleepy/t"
	c, _ := rawConnect(t, gw.Addr(), "dev-sleepy", true)
	c.publish(1, false, topic, "21.5") // PUBACK read
	c.send(packets.NewControlPacket(packets.DISCONNECT))
	c.conn.Close()
	time.Sleep(3 * time.Second) // asleep
	// Wake 2: the new 21.5 (id 1) is lost with the connection.
	c, _ = rawConnect(t, gw.Addr(), "dev-sleepy", false)
	c.conn.Close()
	time.Sleep(3 * time.Second)
	// Wake 3: resent, acknowledged.
	c, present := rawConnect(t, gw.Addr(), "dev-sleepy", false)
	if !present {
		t.Fatal("session not present")
	}
	c.publish(1, true, topic, "21.5")
	st := settled(t, gw, func(st gateway.Stats) bool { return aggregatedCount(st)+st.Duplicates >= 2 })
	if aggregatedCount(st) != 2 {
		t.Errorf("two readings acknowledged: counted %d, duplicates %d; want 2, 0", aggregatedCount(st), st.Duplicates)
	}
}

// TestAttackDuplicateEntriesKept: a device with a persistent session
// whose connections are short (connect, publish a burst, read every
// PUBACK, DISCONNECT) holds no duplicate entries once it is idle: each
// DISCONNECT settles its connection's receipts, though no connection
// lasts long enough for a sample to. (Before, 40 such connections of 100
// readings left all 4,000 entries held, up to 65,535 per client id.)
func TestAttackDuplicateEntriesKept(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-burst/t"
	pid := uint16(0)
	for conn := 0; conn < 40; conn++ {
		c, _ := rawConnect(t, gw.Addr(), "dev-burst", false)
		for i := 0; i < 100; i++ {
			pid++
			cp := packets.NewControlPacket(packets.PUBLISH)
			cp.Content = &packets.Publish{QoS: 1, PacketID: pid, Topic: topic, Payload: []byte(fmt.Sprint(pid)), Properties: &packets.Properties{}}
			c.send(cp)
		}
		for i := uint16(0); i < 100; i++ {
			c.expect(packets.PUBACK, pid-99+i)
		}
		c.send(packets.NewControlPacket(packets.DISCONNECT))
		c.conn.Close()
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // twice receiptTick + receiptMargin, idle
	st := gw.Stats()
	t.Logf("entries %d, acks received %d, counted %d", st.DuplicateEntries, st.AcksReceived, aggregatedCount(st))
	if st.DuplicateEntries > 256 {
		t.Errorf("an idle client whose every PUBACK was read holds %d duplicate entries (every publication of its short connections); want at most 256", st.DuplicateEntries)
	}
}

// TestAttackPahoThroughSlowProxy: Eclipse paho.mqtt.golang (3.1.1,
// persistent session, auto-reconnect) behind a TCP proxy whose
// gateway-to-client direction has latency, as a link with deep buffers
// has. The link is cut now and then; paho reconnects and resends every
// publication it has no PUBACK for, with DUP. The proxy acknowledges the
// gateway's PUBACKs at once and holds them for the latency: with
// mqtt.receipt_margin above it (1 s by default, against 0.5 s of latency;
// 5 s against 3.5 s), the gateway never counts one received that the cut
// lost, and the count is exact. (With 3.5 s of latency and the default
// margin, 300 readings counted 324 to 536.)
func TestAttackPahoThroughSlowProxy(t *testing.T) {
	t.Run("latency 0.5s", func(t *testing.T) { attackThroughProxy(t, "paho-slow-1", latencyForTest(500*time.Millisecond), 0) })
	t.Run("latency 3.5s, margin 5s", func(t *testing.T) {
		attackThroughProxy(t, "paho-slow-2", latencyForTest(3500*time.Millisecond), 5*time.Second)
	})
}

func attackThroughProxy(t *testing.T, device string, latency, margin time.Duration) {
	const n = 300
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.Listen = freeAddr(t)
	if margin > 0 {
		cfg.MQTT.ReceiptMargin = configs.Duration(margin)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := &recorded{t: t, cfg: cfg, out: &recordOutput{}}
	r.start()
	defer func() {
		if r.stop != nil {
			r.stop()
		}
	}()

	proxy := newSlowProxy(t, cfg.MQTT.Listen, latency)
	defer proxy.close()

	store := newAckedStore()
	opts := mqtt3.NewClientOptions().AddBroker("tcp://" + proxy.addr()).SetClientID(device).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(50 * time.Millisecond).SetMaxReconnectInterval(100 * time.Millisecond).
		SetConnectTimeout(10 * time.Second).SetStore(store)
	c := mqtt3.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(patience) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	// Cut the link every 2.5 to 4 s while the readings go out (50 a
	// second), and once more after.
	stopCuts := make(chan struct{})
	cutsDone := make(chan struct{})
	go func() {
		defer close(cutsDone)
		for {
			select {
			case <-stopCuts:
				return
			case <-time.After(2500*time.Millisecond + time.Duration(rand.IntN(1500))*time.Millisecond):
			}
			proxy.cut()
		}
	}()
	for i := range n {
		c.Publish("sensors/"+device+"/t", 1, false, strconv.Itoa(i))
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(4 * time.Second)
	close(stopCuts)
	<-cutsDone
	deadline := time.Now().Add(2 * patience)
	for {
		store.mu.Lock()
		acked, left := len(store.acked), len(store.stored)
		store.mu.Unlock()
		if acked == n && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d publications acknowledged, %d waiting in the client's store", acked, n, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Disconnect(100)
	st := r.gw.Stats()
	r.stop()
	r.stop = nil
	t.Logf("duplicates %d, acks received %d, undelivered %d, entries %d", st.Duplicates, st.AcksReceived, st.AcksUndelivered, st.DuplicateEntries)
	if got := r.out.counted(device); got != n {
		t.Errorf("latency %v: summaries count %d readings; %d acknowledged", latency, got, n)
	}
}

func latencyForTest(d time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv("ATTACK_LATENCY")); err == nil {
		return v
	}
	return d
}

// slowProxy forwards TCP connections to a gateway, the gateway's bytes
// to the client latency late (it reads them at once, so the gateway's
// TCP sees them acknowledged), as a link with deep buffers does; cut
// breaks every connection, dropping what it holds. (toxiproxy's latency
// toxic leaves goroutines behind when its proxy stops.)
type slowProxy struct {
	t       *testing.T
	ln      net.Listener
	latency time.Duration
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newSlowProxy(t *testing.T, upstream string, latency time.Duration) *slowProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{t: t, ln: ln, latency: latency}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(3)
			go func() { defer p.wg.Done(); io.Copy(u, c); u.Close(); c.Close() }()
			type chunk struct {
				at time.Time
				b  []byte
			}
			q := make(chan chunk, 1<<16)
			go func() {
				defer p.wg.Done()
				defer close(q)
				for {
					buf := make([]byte, 4096)
					n, err := u.Read(buf)
					if n > 0 {
						q <- chunk{time.Now().Add(p.latency), buf[:n]}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
			go func() {
				defer p.wg.Done()
				for ch := range q {
					time.Sleep(time.Until(ch.at))
					if _, err := c.Write(ch.b); err != nil {
						u.Close()
						for range q {
						}
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *slowProxy) addr() string { return p.ln.Addr().String() }

func (p *slowProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	p.conns = nil
}

func (p *slowProxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// TestAttackSleepyDeviceRepeatedValue: Debian's python3-paho-mqtt as a
// sleepy device runs it: every wake a new client (paho numbers its
// packet ids from 1 again), a persistent session, one QoS 1 reading,
// wait_for_publish (the PUBACK is in), disconnect. The temperature did
// not change, so the payload is the same each time. The DISCONNECT
// settles the receipt of its PUBACK, so the next wake's reading, without
// DUP, with the same id and value, is not taken for an MQTT.js-style
// resend: three readings count three.
func TestAttackSleepyDeviceRepeatedValue(t *testing.T) {
	if _, err := os.Stat("/usr/lib/python3/dist-packages/paho/mqtt/client.py"); err != nil {
		t.Skip("python3-paho-mqtt not installed")
	}
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	host, port, _ := net.SplitHostPort(gw.Addr())
	const script = `
import sys
import paho.mqtt.client as mqtt
c = mqtt.Client(client_id="dev-sleepy-py", clean_session=False, protocol=mqtt.MQTTv311)
c.connect(sys.argv[1], int(sys.argv[2]), keepalive=30)
c.loop_start()
info = c.publish("sensors/dev-sleepy-py/t", "21.5", qos=1)
info.wait_for_publish(10)
ok = info.is_published()
c.disconnect()
c.loop_stop()
sys.exit(0 if ok else 1)
`
	const wakes = 3
	for i := range wakes {
		out, err := exec.Command("/usr/bin/python3", "-c", script, host, port).CombinedOutput()
		if err != nil {
			t.Fatalf("wake %d: %v: %s", i, err, out)
		}
		time.Sleep(2 * time.Second) // asleep
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return aggregatedCount(st)+st.Duplicates >= wakes })
	if aggregatedCount(st) != wakes {
		t.Errorf("%d readings acknowledged: counted %d, taken for duplicates %d", wakes, aggregatedCount(st), st.Duplicates)
	}
}

// TestAttackPublicationOutlivesItsConnection: a publication read just
// before its connection ended must not be journaled after the client's
// next connection began. With mqtt.publish_rate_per_client at 1 a second,
// the device's second reading waits in OnPublish (throttle) for its
// token. Its link breaks meanwhile; the device reconnects at once and
// resends the reading (DUP), which is new to the gateway and counted.
// When the old connection's copy leaves the throttle, the journal refuses
// it (its connection ended: journal.Connection), so it is not counted
// again as a new publication of the current connection.
func TestAttackPublicationOutlivesItsConnection(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.PublishRate = 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic = "sensors/dev-tk/t"
	c1, _ := rawConnect(t, gw.Addr(), "dev-tk", true)
	c1.publish(1, false, topic, "20")
	cp := packets.NewControlPacket(packets.PUBLISH)
	cp.Content = &packets.Publish{QoS: 1, PacketID: 2, Topic: topic, Payload: []byte("21"), Properties: &packets.Properties{}}
	c1.send(cp) // waits for the publish rate's token
	time.Sleep(100 * time.Millisecond)
	c1.conn.Close() // the link breaks; no PUBACK came
	c2, present := rawConnect(t, gw.Addr(), "dev-tk", false)
	if !present {
		t.Fatal("session not present")
	}
	c2.publish(2, true, topic, "21") // resent
	time.Sleep(2 * time.Second)      // the old copy leaves the throttle
	st := settled(t, gw, func(st gateway.Stats) bool { return aggregatedCount(st) >= 2 })
	if aggregatedCount(st) != 2 {
		t.Errorf("two readings acknowledged: counted %d, duplicates %d; want 2", aggregatedCount(st), st.Duplicates)
	}
}

// TestAttackMosquittoPubCron: TestAttackSleepyDeviceRepeatedValue with
// mosquitto_pub run from cron, the usual way a script reports a reading:
// -c (a persistent session, so that nothing is lost while the gateway
// restarts), -q 1, the same client id every time, and a value that did
// not change. mosquitto_pub numbers from 1 each run and sends DISCONNECT
// once the PUBACK is in: every run's reading counts.
func TestAttackMosquittoPubCron(t *testing.T) {
	pub, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		t.Skip("mosquitto_pub not installed")
	}
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	host, port, _ := net.SplitHostPort(gw.Addr())
	const runs = 3
	for i := range runs {
		out, err := exec.Command(pub, "-h", host, "-p", port, "-i", "cron-dev", "-c", "-q", "1",
			"-t", "sensors/cron-dev/t", "-m", "21.5").CombinedOutput()
		if err != nil {
			t.Fatalf("run %d: %v: %s", i, err, out)
		}
		time.Sleep(1500 * time.Millisecond)
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return aggregatedCount(st)+st.Duplicates >= runs })
	if aggregatedCount(st) != runs {
		t.Errorf("%d readings acknowledged: counted %d, taken for duplicates %d", runs, aggregatedCount(st), st.Duplicates)
	}
}

// TestAttackReceiptLagHoldsWellBehavedClient: flow control on
// publications whose receipt is not known must not hold a client that
// keeps within its window, however small mqtt.receive_maximum is:
// receipts lag by a tick and the margin (up to 2 s), so the bound is at
// least 4,096, not 16 × mqtt.receive_maximum (128 at 8, which held a
// client within its window of 8 at 500 readings a second to about 64).
func TestAttackReceiptLagHoldsWellBehavedClient(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ReceiveMaximum = 8
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	const topic, n, window = "sensors/dev-window/t", 500, 8
	c, _ := rawConnect(t, gw.Addr(), "dev-window", true)
	acked := make(chan uint16, n)
	go func() {
		for range n {
			c.conn.SetReadDeadline(time.Now().Add(patience))
			resp, err := packets.ReadPacket(c.conn)
			if err != nil {
				close(acked)
				return
			}
			acked <- resp.PacketID()
		}
	}()
	start := time.Now()
	inflight := 0
	for i := range n {
		for inflight >= window {
			if _, ok := <-acked; !ok {
				t.Fatal("connection ended")
			}
			inflight--
		}
		cp := packets.NewControlPacket(packets.PUBLISH)
		cp.Content = &packets.Publish{QoS: 1, PacketID: uint16(i + 1), Topic: topic, Payload: []byte(strconv.Itoa(i)), Properties: &packets.Properties{}}
		c.send(cp)
		inflight++
		time.Sleep(2 * time.Millisecond) // 500 a second at most
	}
	for inflight > 0 {
		if _, ok := <-acked; !ok {
			t.Fatal("connection ended")
		}
		inflight--
	}
	took := time.Since(start)
	st := gw.Stats()
	t.Logf("%d readings in %v (%.0f/s); flow held %d", n, took, float64(n)/took.Seconds(), st.FlowHeld)
	if st.FlowHeld > 0 {
		t.Errorf("a client within its window and half the publish rate was held %d times; %d readings took %v", st.FlowHeld, n, took)
	}
}
