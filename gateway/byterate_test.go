package gateway_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// TestPublishByteRate: the publish rate counts messages, so a client
// within it may still send max_packet_bytes a message. At
// mqtt.publish_bytes_rate_per_client a client writing large payloads as
// fast as it can is held to the byte rate: its publications are read no
// faster (TCP slows it), none is refused or lost, and the held ones are
// counted as throttled.
func TestPublishByteRate(t *testing.T) {
	const n, size = 64, 32 << 10
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.PublishRate = 0 // the byte rate alone
	cfg.MQTT.PublishBytesRate, cfg.MQTT.PublishBytesBurst = 1<<20, configs.ByteSize(cfg.MQTT.MaxPacket)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	c, code := dialV5(t, dial(t, gw.Addr()), "big", "", "")
	if code != 0 {
		t.Fatalf("CONNACK %#x", code)
	}
	// A bare number padded to 32 KiB with the white space JSON allows.
	start := time.Now()
	total := 0
	for i := range n {
		payload := append([]byte(fmt.Sprint(i)), bytes.Repeat([]byte(" "), size)...)
		p := &packets.Publish{Topic: "sensors/big/x", Payload: payload, Properties: &packets.Properties{}}
		total += len(p.Topic) + len(p.Payload)
		c.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH}, Content: p})
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Outcomes["aggregated"] >= n })
	took := time.Since(start)
	// What is beyond the burst goes at the rate.
	least := time.Duration(float64(total-int(cfg.MQTT.PublishBytesBurst)) / float64(cfg.MQTT.PublishBytesRate) * float64(time.Second))
	if took < least-100*time.Millisecond || st.Outcomes["aggregated"] != n || st.Throttled == 0 {
		t.Errorf("%d publications of %d bytes at %d B/s, bursts of %d: took %v, aggregated %d, throttled %d; want ≥ %v, %d, some",
			n, size, cfg.MQTT.PublishBytesRate, cfg.MQTT.PublishBytesBurst, took, st.Outcomes["aggregated"], st.Throttled, least, n)
	}
}
