//go:build e2e

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
)

var soakFor = flag.Duration("soak", 60*time.Second, "TestSoakUnderAttack: how long each run lasts")

// TestSoakUnderAttack runs 1,000 well-behaved devices publishing QoS 1
// against a gateway delivering to kfake, twice: alone, and while the
// hostile clients (a client that never reads, dead-letter and series
// bombs, sessions left behind, receive-maximum floods) run together. In
// both runs every acknowledged reading of the good devices must be in
// Kafka exactly once (edgesim verify), and under attack no good device's
// PUBACK may stall: the p99 must stay under a quarter of a second and
// four times the run without attackers. The ratio itself (the target is
// 2×) is a figure to read in the log, not a pass mark: on a shared
// 2-core machine the attackers' own processes take CPU from both.
func TestSoakUnderAttack(t *testing.T) {
	quiet := soak(t, false)
	attacked := soak(t, true)
	t.Logf("PUBACK of the good devices: alone p50 %.1f ms p99 %.1f ms; under attack p50 %.1f ms p99 %.1f ms (%.2f×)",
		quiet.p50, quiet.p99, attacked.p50, attacked.p99, attacked.p99/quiet.p99)
	t.Logf("attacks: %s", attacked.attacks)
	if attacked.p99 > max(4*quiet.p99, 250) {
		t.Errorf("PUBACK p99 under attack %.1f ms: the good devices stalled (%.1f ms without attackers)", attacked.p99, quiet.p99)
	}
}

type soakResult struct {
	p50, p99 float64 // ms
	attacks  string
}

func soak(t *testing.T, attack bool) soakResult {
	name := map[bool]string{false: "alone", true: "attacked"}[attack]
	_, brokers := kafkatest.Start(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")
	cfg := configs.Default()
	cfg.Gateway.ID, cfg.Gateway.DataDir = "gw-soak-"+name, t.TempDir()
	cfg.MQTT.Listen, cfg.MQTT.AllowAnonymous = "127.0.0.1:0", true
	// The good devices connect from 127.0.0.1, exempt from the connect
	// rate as local services are; the attackers come from 127.0.0.2, as a
	// host on the LAN would, and are held to it.
	cfg.MQTT.ConnectRateExempt = []string{"127.0.0.1/32"}
	cfg.HTTP.Listen = ""
	cfg.Kafka.Brokers = brokers
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, fwd, stopGateway := startStack(t, &cfg)
	defer stopGateway()

	actx, acancel := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	counts := &attackCounts{}
	if attack {
		for _, a := range []func(context.Context, string, *attackCounts){pingFlood, deadLetterBomb, seriesBomb, sessionFlood, inflightFlood} {
			attackers.Add(1)
			go func() { defer attackers.Done(); a(actx, gw.Addr(), counts) }()
		}
	}
	truthPath := filepath.Join(t.TempDir(), "truth.jsonl")
	var out bytes.Buffer
	status := runMain(context.Background(), []string{"run", "--devices", "1000", "--metrics", "1", "--rate", "1", "--qos", "1",
		"--form", "object", "--duration", soakFor.String(), "--addr", gw.Addr(), "--truth", truthPath}, &out, &out)
	acancel()
	attackers.Wait()
	if status != 0 {
		t.Fatalf("%s: edgesim run: status %d\n%s", name, status, out.String())
	}
	t.Logf("%s: edgesim run:\n%s", name, lastLines(out.String(), 12))
	stopGateway()
	for deadline := time.Now().Add(60 * time.Second); fwd.Stats().Queued > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: forwarder still has %d records queued", name, fwd.Stats().Queued)
		}
	}
	res := soakResult{p50: tableValue(t, out.String(), "PUBACK p50 ms"), p99: tableValue(t, out.String(), "PUBACK p99 ms"), attacks: counts.String()}
	out.Reset()
	if status := runMain(context.Background(), []string{"verify", "--truth", truthPath, "--brokers", strings.Join(brokers, ","),
		"--devices", "sim-*", "--idle", "5s"}, &out, &out); status != 0 { // --idle counts from before the first fetch
		t.Errorf("%s: verify: status %d\n%s", name, status, out.String())
	} else {
		t.Logf("%s: verify:\n%s", name, lastLines(out.String(), 4))
	}
	return res
}

// tableValue reads a figure from edgesim run's summary table.
func tableValue(t *testing.T, table, row string) float64 {
	for _, l := range strings.Split(table, "\n") {
		if v, ok := strings.CutPrefix(l, row); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	t.Fatalf("no %q in\n%s", row, table)
	return 0
}

// attackCounts counts what the attackers managed to do.
type attackCounts struct {
	mu                                          sync.Mutex
	pings, bombs, seriesBombs, sessions, floods int
	connects                                    int
}

func (c *attackCounts) add(f *int) { c.mu.Lock(); *f++; c.mu.Unlock() }

func (c *attackCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%d PINGREQs unread, %d dead-letter bombs, %d series bombs, %d sessions left behind, %d receive-maximum floods, %d attacker connections",
		c.pings, c.bombs, c.seriesBombs, c.sessions, c.floods, c.connects)
}

// Raw MQTT packets, enough for the attackers.

func mqttString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func packet(kind byte, body []byte) []byte {
	b := []byte{kind}
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

// connectPacket is a CONNECT for protocol 4 (3.1.1) or 5.
func connectPacket(proto byte, id string, clean bool, keepAlive uint16) []byte {
	b := mqttString(nil, "MQTT")
	b = append(b, proto)
	flags := byte(0)
	if clean {
		flags |= 0x02
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint16(b, keepAlive)
	if proto == 5 {
		if clean {
			b = append(b, 0)
		} else {
			b = append(b, 5, 0x11, 0, 0, 0x0e, 0x10) // session expiry 3600 s
		}
	}
	return packet(0x10, mqttString(b, id))
}

func publishPacket(proto byte, topic string, pid uint16, payload []byte) []byte {
	b := mqttString(nil, topic)
	b = binary.BigEndian.AppendUint16(b, pid)
	if proto == 5 {
		b = append(b, 0)
	}
	return packet(0x32, append(b, payload...)) // QoS 1
}

// dial connects and sends CONNECT; a goroutine drains what the broker
// writes unless read is false.
func dial(ctx context.Context, addr string, c *attackCounts, connect []byte, read bool) net.Conn {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	c.add(&c.connects)
	if read {
		go io.Copy(io.Discard, bufio.NewReader(conn))
	} else if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(1024)
	}
	conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(connect); err != nil {
		conn.Close()
		return nil
	}
	return conn
}

func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// pingFlood (1): a 3.1.1 client with keep alive 0 and a tiny receive
// buffer sends PINGREQs without end, a QoS 1 publication among every 512,
// and never reads.
func pingFlood(ctx context.Context, addr string, c *attackCounts) {
	for ctx.Err() == nil {
		conn := dial(ctx, addr, c, connectPacket(4, "atk-ping", true, 0), false)
		if conn == nil {
			pause(ctx, 200*time.Millisecond)
			continue
		}
		ping := bytes.Repeat([]byte{0xc0, 0x00}, 512)
		for pid := uint16(1); ctx.Err() == nil; pid = pid%60000 + 1 {
			conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			conn.Write(publishPacket(4, "sensors/atk-ping/v", pid, []byte("1")))
			conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := conn.Write(ping)
			c.mu.Lock()
			c.pings += n / 2
			c.mu.Unlock()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue // the gateway stopped reading us: keep the socket
				}
				break // disconnected: come back
			}
		}
		conn.Close()
		pause(ctx, time.Second) // then the attack again (a connect flood is another test's)
	}
}

// deadLetterBomb (2): once a second, a 60 KB JSON object with thousands
// of non-numeric fields.
func deadLetterBomb(ctx context.Context, addr string, c *attackCounts) {
	var body bytes.Buffer
	body.WriteByte('{')
	for i := 0; body.Len() < 60_000; i++ {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `"f%d":"x"`, i)
	}
	body.WriteByte('}')
	attackLoop(ctx, addr, c, "atk-dead", func(conn net.Conn, n int) error {
		_, err := conn.Write(publishPacket(5, "sensors/atk-dead", uint16(n%60000+1), body.Bytes()))
		c.add(&c.bombs)
		return err
	})
}

// seriesBomb (3): once a second, an object with 5,000 metrics never seen
// before.
func seriesBomb(ctx context.Context, addr string, c *attackCounts) {
	attackLoop(ctx, addr, c, "atk-series", func(conn net.Conn, n int) error {
		var body bytes.Buffer
		body.WriteByte('{')
		for i := range 5000 {
			if i > 0 {
				body.WriteByte(',')
			}
			fmt.Fprintf(&body, `"m%d_%d":1`, n, i)
		}
		body.WriteByte('}')
		_, err := conn.Write(publishPacket(5, "sensors/atk-series", uint16(n%60000+1), body.Bytes()))
		c.add(&c.seriesBombs)
		return err
	})
}

// attackLoop keeps one MQTT 5 connection as id and calls send once a
// second.
func attackLoop(ctx context.Context, addr string, c *attackCounts, id string, send func(net.Conn, int) error) {
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for n := 0; ctx.Err() == nil; n++ {
		if conn == nil {
			if conn = dial(ctx, addr, c, connectPacket(5, id, true, 30), true); conn == nil {
				pause(ctx, 200*time.Millisecond)
				continue
			}
		}
		conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if err := send(conn, n); err != nil { // disconnected: again, a second later
			conn.Close()
			conn = nil
		}
		pause(ctx, time.Second)
	}
}

// sessionFlood (4): five times a second a new client id with a persistent
// session, which it leaves behind.
func sessionFlood(ctx context.Context, addr string, c *attackCounts) {
	for n := 0; ctx.Err() == nil; n++ {
		if conn := dial(ctx, addr, c, connectPacket(4, fmt.Sprintf("atk-sess-%06d", n), false, 30), true); conn != nil {
			c.add(&c.sessions)
			pause(ctx, 50*time.Millisecond)
			conn.Close()
		}
		pause(ctx, 150*time.Millisecond)
	}
}

// inflightFlood (5): an MQTT 5 client sends 400 QoS 1 publications without
// waiting for a PUBACK (receive maximum 256), reusing packet ids from 1
// after each reconnect, as rebooted firmware does.
func inflightFlood(ctx context.Context, addr string, c *attackCounts) {
	attackLoop(ctx, addr, c, "atk-inflight", func(conn net.Conn, n int) error {
		var b []byte
		for i := range 400 {
			b = append(b, publishPacket(5, "sensors/atk-inflight/v", uint16(i+1), []byte(strconv.Itoa(n)))...)
		}
		_, err := conn.Write(b)
		c.add(&c.floods)
		return err
	})
}
