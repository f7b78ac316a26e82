package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// heapMiB returns the live heap after a collection.
func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// TestRetainedBounded: a device publishes 256 retained readings of
// 200 KiB, each on a metric of its own. Every one is acknowledged and
// journaled, but the broker keeps only what mqtt.max_retained_*_per_identity
// allow: the rest are not retained (counted as retained_limit), and the
// heap does not grow by the 50 MB mochi would otherwise hold for a day.
// A deletion (empty retained payload) frees the device's share.
func TestRetainedBounded(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()
	dev, err := connect(t, gw.Addr(), "dev1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 256, 200 << 10
	body := bytes.Repeat([]byte("7"), size)
	before := heapMiB()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		pr, err := dev.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("sensors/dev1/m%d", i), QoS: 1, Retain: true, Payload: body})
		cancel()
		if err != nil || pr.ReasonCode != 0 {
			t.Fatalf("retained publication %d: %v, %v; want it acknowledged", i, pr, err)
		}
	}
	st := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes >= n })
	grew := heapMiB() - before
	t.Logf("heap grew %.1f MiB for %d retained publications of %d KiB; %d retained (%d bytes), refused %d",
		grew, n, size>>10, st.MQTTRetained, st.MQTTRetainedBytes, st.MQTTRefused["retained_limit"])
	if st.Publishes < n {
		t.Fatalf("%d publications journaled, want %d", st.Publishes, n)
	}
	limit := cfg.MQTT.MaxRetainedBytesPerIdentity
	if grew > float64(limit)/(1<<20)+16 {
		t.Errorf("heap grew %.1f MiB; mqtt.max_retained_bytes_per_identity is %d bytes", grew, limit)
	}
	if st.MQTTRetainedBytes > int64(limit) || st.MQTTRetained == 0 || st.MQTTRefused["retained_limit"] != int64(n-st.MQTTRetained) {
		t.Fatalf("retained %d (%d bytes), refused %d; want some, within %d bytes, the rest refused",
			st.MQTTRetained, st.MQTTRetainedBytes, st.MQTTRefused["retained_limit"], limit)
	}

	// A subscriber gets the retained messages kept, and the rest routed
	// without the retain flag.
	got := make(chan *paho.Publish, n)
	sub := pahoClient(t, gw.Addr(), "viewer", got)
	if _, err := sub.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "sensors/dev1/#", QoS: 0}}}); err != nil {
		t.Fatal(err)
	}
	for range st.MQTTRetained {
		select {
		case m := <-got:
			if !m.Retain {
				t.Fatalf("%s: not marked retained", m.Topic)
			}
		case <-time.After(patience):
			t.Fatal("a retained message kept was not received")
		}
	}

	// Deleting one always works and frees its share: another metric may
	// then be retained.
	held := st.MQTTRetained
	for _, p := range []*paho.Publish{
		{Topic: "sensors/dev1/m0", QoS: 1, Retain: true},
		{Topic: "sensors/dev1/fresh", QoS: 1, Retain: true, Payload: body},
	} {
		if pr, err := dev.Publish(context.Background(), p); err != nil || pr.ReasonCode != 0 {
			t.Fatalf("%s: %v, %v", p.Topic, pr, err)
		}
	}
	if st := gw.Stats(); st.MQTTRetained != held || st.MQTTRefused["retained_limit"] != int64(n-held) {
		t.Fatalf("after a deletion and a new one: %d retained, refused %d; want %d, %d",
			st.MQTTRetained, st.MQTTRefused["retained_limit"], held, n-held)
	}
}

// TestAwaySessionQueueBounded: while a persistent subscriber (a
// dashboard) is away, a device sends 160 QoS 1 readings of 200 KiB. mochi
// would keep a copy of each for the session (up to 8,192 of them); the
// gateway keeps mqtt.max_queued_bytes_per_session, drops the rest
// (counted), and the subscriber gets what was kept when it comes back.
func TestAwaySessionQueueBounded(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	defer stop()

	conn, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	expiry := uint32(3600)
	dash := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "dashboard"})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := dash.Connect(ctx, &paho.Connect{ClientID: "dashboard", KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
		t.Fatal(err)
	}
	if _, err := dash.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "sensors/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	conn.Close() // away, its session kept
	settled(t, gw, func(s gateway.Stats) bool { return s.Clients == 0 })

	dev, err := connect(t, gw.Addr(), "dev1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 160, 200 << 10
	body := bytes.Repeat([]byte("7"), size)
	before := heapMiB()
	for i := range n {
		pr, err := dev.Publish(ctx, &paho.Publish{Topic: "sensors/dev1/temp", QoS: 1, Payload: body})
		if err != nil || pr.ReasonCode != 0 {
			t.Fatalf("publication %d: %v, %v", i, pr, err)
		}
	}
	st := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes >= n })
	grew := heapMiB() - before
	limit := cfg.MQTT.MaxQueuedBytesPerSession
	t.Logf("heap grew %.1f MiB for %d readings of %d KiB queued for an away session; queued %d bytes, dropped %v",
		grew, n, size>>10, st.MQTTQueuedBytes, st.MQTTQueuedDropped)
	if grew > float64(limit)/(1<<20)+16 {
		t.Errorf("heap grew %.1f MiB; mqtt.max_queued_bytes_per_session is %d bytes", grew, limit)
	}
	// The bound is checked before a message's size is known: one more
	// may pass it.
	kept := n - int(st.MQTTQueuedDropped["session_bytes"])
	if st.MQTTQueuedBytes > int64(limit)+int64(cfg.MQTT.MaxPacket) || kept <= 0 || kept == n {
		t.Fatalf("queued %d bytes, dropped %v; want some, within %d bytes and a packet, the rest dropped", st.MQTTQueuedBytes, st.MQTTQueuedDropped, limit)
	}

	// Back: it receives what was kept, and the account is freed as it
	// acknowledges.
	got := make(chan *paho.Publish, n)
	conn, err = net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	dash = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: "dashboard", OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(r paho.PublishReceived) (bool, error) { got <- r.Packet; return true, nil }}})
	if ca, err := dash.Connect(ctx, &paho.Connect{ClientID: "dashboard", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil || !ca.SessionPresent {
		t.Fatalf("resume: %v, %v", ca, err)
	}
	defer dash.Disconnect(&paho.Disconnect{})
	for i := range kept {
		select {
		case <-got:
		case <-time.After(patience):
			t.Fatalf("%d of the %d readings kept received", i, kept)
		}
	}
	if st := settled(t, gw, func(s gateway.Stats) bool { return s.MQTTQueuedBytes == 0 }); st.MQTTQueuedBytes != 0 {
		t.Fatalf("queued %d bytes after the subscriber acknowledged everything", st.MQTTQueuedBytes)
	}
}

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
