package gateway_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// TestSparkplugDelayedWill: an MQTT 5 edge node with a clean session
// sets a will delay on its will, its NDEATH. Its session ends with its
// connection, so the will is due at once [MQTT-3.1.3-9]; mochi held it for
// the delay and then published it without telling the hook, which never
// journaled it, and the node stayed online.
func TestSparkplugDelayedWill(t *testing.T) {
	cfg := sparkplugConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	delay := uint32(1)
	conn, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	e := &spClient{t: t, got: make(chan *paho.Publish, 10), group: "plant", node: "line1"}
	e.c = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "line1"})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := e.c.Connect(ctx, &paho.Connect{ClientID: "line1", KeepAlive: 30, CleanStart: true,
		WillMessage:    &paho.WillMessage{QoS: 1, Topic: "spBv1.0/plant/NDEATH/line1", Payload: payload.AppendSparkplug(nil, 0, -1, []payload.SparkplugOut{bdSeq(0)})},
		WillProperties: &paho.WillProperties{WillDelayInterval: &delay}}); err != nil {
		t.Fatal(err)
	}
	if rc := e.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("temp", 1, 20, time.Time{})); rc != 0 {
		t.Fatalf("NBIRTH refused: %#x", rc)
	}
	if s := settled(t, gw, func(s gateway.Stats) bool { return s.Sparkplug.NodesOnline == 1 }); s.Sparkplug.NodesOnline != 1 {
		t.Fatalf("after NBIRTH: %+v", s.Sparkplug)
	}
	conn.Close()
	// Well past the delay (1 s, and mochi's once-a-second check).
	deadline := time.Now().Add(5 * time.Second)
	var s gateway.Stats
	for s = gw.Stats(); s.Sparkplug.NodesOnline != 0 && time.Now().Before(deadline); s = gw.Stats() {
		time.Sleep(20 * time.Millisecond)
	}
	if sp := s.Sparkplug; sp.NodesOnline != 0 || sp.SessionsEnded != 1 {
		t.Fatalf("5 s after the connection broke: %d nodes online, %d sessions ended; want its NDEATH journaled", sp.NodesOnline, sp.SessionsEnded)
	}
}
