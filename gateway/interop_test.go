package gateway_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// plainMochi runs an unmodified mochi broker (allowing everyone) on a
// free port and returns its address: what the gateway's broker is
// compared with.
func plainMochi(t *testing.T) string {
	t.Helper()
	s := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.DiscardHandler)})
	if err := s.AddHook(new(allowAll), nil); err != nil {
		t.Fatal(err)
	}
	l := listeners.NewTCP(listeners.Config{ID: "plain", Address: "127.0.0.1:0"})
	if err := s.AddListener(l); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return l.Address()
}

// allowAll lets every client connect, publish and subscribe (mochi's
// auth.AllowHook, whose package pulls in a YAML module).
type allowAll struct{ mqtt.HookBase }

func (*allowAll) ID() string { return "allow-all" }
func (*allowAll) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}
func (*allowAll) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }
func (*allowAll) OnACLCheck(*mqtt.Client, string, bool) bool              { return true }

// pahoClient connects an MQTT 5 client that passes every publication it
// receives to got.
func pahoClient(t *testing.T, addr, id string, got chan<- *paho.Publish) *paho.Client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(p paho.PublishReceived) (bool, error) {
			if got != nil {
				got <- p.Packet
			}
			return true, nil
		},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}); err != nil {
		conn.Close()
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() { c.Disconnect(&paho.Disconnect{}) })
	return c
}

// TestRequestResponse: MQTT 5 request/response between two local clients
// that both subscribe to the request topic with noLocal: the responder
// gets the request with its Response Topic and Correlation Data, the
// requester does not get its own, and the response comes back; on the
// gateway's broker as on a plain mochi broker.
//
// Before the request, a third client that never subscribed unsubscribes
// from the request topic, twice, as a client clearing what an earlier
// session might have left does. mochi counts each such UNSUBSCRIBE as a
// subscription removed (Topics.Unsubscribe reports the topic's node, not
// the client's subscription), so its Info.Subscriptions says nobody is
// subscribed: the broker must not believe it.
func TestRequestResponse(t *testing.T) {
	gw, stop := runGateway(t, testConfig(t, []string{"127.0.0.1:9"}))
	defer stop()
	for name, addr := range map[string]string{"plain mochi": plainMochi(t), "gateway": gw.Addr()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			toA, toB := make(chan *paho.Publish, 10), make(chan *paho.Publish, 10)
			a := pahoClient(t, addr, "requester", toA)
			b := pahoClient(t, addr, "responder", toB)
			for _, c := range []*paho.Client{a, b} {
				if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "app/requests", QoS: 2, NoLocal: true}}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "app/responses/requester", QoS: 1}}}); err != nil {
				t.Fatal(err)
			}
			cleaner := pahoClient(t, addr, "cleaner", nil)
			for range 3 {
				if _, err := cleaner.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"app/requests"}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Publish(ctx, &paho.Publish{Topic: "app/requests", QoS: 1, Payload: []byte("ping"),
				Properties: &paho.PublishProperties{ResponseTopic: "app/responses/requester", CorrelationData: []byte("c-1")}}); err != nil {
				t.Fatalf("request: %v", err)
			}
			var req *paho.Publish
			select {
			case req = <-toB:
			case <-time.After(patience):
				t.Fatal("the responder got no request")
			}
			if req.Topic != "app/requests" || string(req.Payload) != "ping" || req.Properties == nil ||
				req.Properties.ResponseTopic != "app/responses/requester" || !bytes.Equal(req.Properties.CorrelationData, []byte("c-1")) {
				t.Fatalf("request arrived as %+v (properties %+v)", req, req.Properties)
			}
			if _, err := b.Publish(ctx, &paho.Publish{Topic: req.Properties.ResponseTopic, QoS: 1, Payload: []byte("pong"),
				Properties: &paho.PublishProperties{CorrelationData: req.Properties.CorrelationData}}); err != nil {
				t.Fatalf("response: %v", err)
			}
			select {
			case resp := <-toA:
				if resp.Topic != "app/responses/requester" || string(resp.Payload) != "pong" || resp.Properties == nil ||
					!bytes.Equal(resp.Properties.CorrelationData, []byte("c-1")) {
					t.Fatalf("requester got %+v, want the response (its own request is noLocal)", resp)
				}
			case <-time.After(patience):
				t.Fatal("the requester got no response")
			}
		})
	}
}

// TestDollarTopics: an admin may publish to topics starting with '$'
// other than $SYS (an application's own "$app/..." namespace, as cloud
// bridges use): MQTT 5 gets PUBACK 0, 3.1.1 its PUBACK rather than a
// disconnect, and a subscriber to "$app/#" gets the message while one to
// "#" does not ([MQTT-4.7.2-1]); on the gateway's broker as on a plain
// mochi broker.
func TestDollarTopics(t *testing.T) {
	gw, stop := runGateway(t, testConfig(t, []string{"127.0.0.1:9"})) // anonymous clients are admins
	defer stop()
	for name, addr := range map[string]string{"plain mochi": plainMochi(t), "gateway": gw.Addr()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dollar, all := make(chan *paho.Publish, 10), make(chan *paho.Publish, 10)
			for id, got := range map[string]chan *paho.Publish{"dollar-sub": dollar, "all-sub": all} {
				filter := "$app/#"
				if got == all {
					filter = "#"
				}
				if _, err := pahoClient(t, addr, id, got).Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
					t.Errorf("admin subscribing to %s: %v", filter, err)
				}
			}
			admin, _ := dialV5(t, dial(t, addr), "admin-5", "", "")
			if code := admin.publish(1, "$app/status", "up"); code != 0 {
				t.Errorf("MQTT 5 publication to $app/status: PUBACK %#x, want 0", code)
			}
			select {
			case p := <-dollar:
				if p.Topic != "$app/status" || string(p.Payload) != "up" {
					t.Errorf("$app/# subscriber got %s=%s", p.Topic, p.Payload)
				}
			case <-time.After(patience):
				t.Error("$app/# subscriber got nothing")
			}
			c3 := dial(t, addr)
			defer c3.Close()
			c3.Write(v3Connect("admin-3", "", ""))
			if f, err := readFrame(c3); err != nil || len(f) != 3 || f[2] != 0 {
				t.Fatalf("3.1.1 connect: %x %v", f, err)
			}
			c3.Write(v3Publish(7, "$app/status", "down"))
			if f, err := readFrame(c3); err != nil || !bytes.Equal(f, []byte{0x40, 0, 7}) {
				t.Errorf("3.1.1 publication to $app/status: got %x (%v), want PUBACK 7", f, err)
			}
			select {
			case p := <-dollar:
				if string(p.Payload) != "down" {
					t.Errorf("$app/# subscriber got %s=%s", p.Topic, p.Payload)
				}
			case <-time.After(patience):
				t.Error("$app/# subscriber got nothing from the 3.1.1 admin")
			}
			select {
			case p := <-all:
				t.Errorf("# subscriber got %s", p.Topic)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}
