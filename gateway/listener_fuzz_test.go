package gateway_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// FuzzListener writes raw bytes to a live gateway's MQTT listener, as the
// first bytes of a connection or after a valid MQTT 5 CONNECT, with the
// gateway's own configuration and hook. After each input a fresh client
// must still connect: no input may stop or wedge the broker. (A panic in
// any goroutine other than the connection's would end the process and
// fail the fuzz run.)
func FuzzListener(f *testing.F) {
	connect := func(id string) []byte {
		first, body := encode(f, &packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.CONNECT},
			Content: &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true, KeepAlive: 30, Properties: &packets.Properties{}}})
		return frame(first, body)
	}
	// mochi-mqtt/server#501: an MQTT 5 SUBSCRIBE (packet id 1, no
	// properties, filter "a/b") that ends before its options byte.
	f.Add(true, []byte{0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x03, 'a', '/', 'b'})
	f.Add(true, []byte{0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x03, 'a', '/', 'b'})
	f.Add(false, []byte{0x10, 0xff, 0xff, 0xff, 0x7f})                                  // CONNECT of 256 MB
	f.Add(true, []byte{0x30, 0xff, 0xff, 0xff, 0x7f, 0x00})                             // PUBLISH of 256 MB
	f.Add(true, []byte{0x32, 0x0a, 0x00, 0x03, 'a', '/', '#', 0x00, 0x01, 0x00, '1'})   // wildcard topic
	f.Add(true, []byte{0x30, 0x08, 0x00, 0x03, 'a', 0x00, 'b', 0x00, '1', '2'})         // U+0000
	f.Add(true, []byte{0x30, 0x09, 0x00, 0x03, 'a', 0xff, 'b', 0x03, 0x23, 0x00, 0x00}) // bad UTF-8, alias 0
	f.Add(false, connect("fz")[:9])
	f.Add(false, append(connect("fz"), 0xc0, 0x00))
	f.Add(true, []byte{0xa2, 0x04, 0x00, 0x01, 0x00, 0x00}) // UNSUBSCRIBE without a topic
	f.Add(true, []byte{0xf0, 0x02, 0x18, 0x00})             // AUTH
	f.Add(true, []byte{0x62, 0x02, 0x00, 0x01, 0x62, 0x03, 0x00, 0x01, 0x92})

	cfg := abuseConfig(f)
	cfg.MQTT.ConnectRate = 0
	gw, stop := runGateway(f, cfg)
	f.Cleanup(stop)
	addr := gw.Addr()
	hello, fuzzConnect := connect("fuzz-probe"), connect("fuzz")

	f.Fuzz(func(t *testing.T, afterConnect bool, data []byte) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if afterConnect {
			conn.Write(fuzzConnect)
		}
		conn.Write(data)
		conn.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		io.Copy(io.Discard, conn)
		conn.Close()

		probe, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("gateway stopped accepting: %v", err)
		}
		defer probe.Close()
		probe.Write(hello)
		probe.SetReadDeadline(time.Now().Add(patience))
		p, err := packets.ReadPacket(probe)
		if err != nil {
			t.Fatalf("gateway stopped answering: %v", err)
		}
		if ack, ok := p.Content.(*packets.Connack); !ok || ack.ReasonCode != 0 {
			t.Fatalf("probe: got %v", p)
		}
	})
}
