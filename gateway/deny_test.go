package gateway_test

import (
	"net"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/packets"

	"github.com/edgegate/edgegate/configs"
)

// v3Subscribe frames a 3.1.1 SUBSCRIBE of one filter at QoS 0.
func v3Subscribe(pid uint16, filter string) []byte {
	body := append([]byte{byte(pid >> 8), byte(pid)}, mqttString(filter)...)
	return frame(0x82, append(body, 0))
}

// v3Topics reads 3.1.1 PUBLISH frames (QoS 0) from conn until one on
// topic last, and returns their topics.
func v3Topics(t *testing.T, conn net.Conn, last string) []string {
	t.Helper()
	var topics []string
	for {
		f, err := readFrame(conn)
		if err != nil {
			t.Fatalf("3.1.1 subscriber, read after %v: %v", topics, err)
		}
		if f[0]&0xf0 != 0x30 {
			continue
		}
		n := int(f[1])<<8 | int(f[2])
		topic := string(f[3 : 3+n])
		topics = append(topics, topic)
		if topic == last {
			return topics
		}
	}
}

// v5Topics reads PUBLISH packets from c until one on topic last, and
// returns their topics.
func v5Topics(c *v5, last string) []string {
	c.t.Helper()
	var topics []string
	for {
		p, ok := c.read().Content.(*packets.Publish)
		if !ok {
			continue
		}
		topics = append(topics, p.Topic)
		if p.Topic == last {
			return topics
		}
	}
}

// TestACLDeny: a role may subscribe to "#" and be kept off "secret/#".
// Its SUBSCRIBE to a filter within the denied one is refused (MQTT 5:
// SUBACK 0x87; 3.1.1: 0x80); its subscription to "#" is granted but no
// message on a denied topic is sent on it, retained or not; its
// PUBLISH to a denied topic is refused (PUBACK 0x87), and others go
// through.
func TestACLDeny(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = false
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dash": "pw-d", "ops": "pw-o"})
	cfg.MQTT.ACL.Users = map[string]string{"dash": "dash", "ops": "admin"}
	cfg.MQTT.ACL.Roles = map[string]configs.Role{"dash": {
		Subscribe: []string{"#"}, DenySubscribe: []string{"secret/#"},
		Publish: []string{"#"}, DenyPublish: []string{"secret/#", "+/locked"},
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()

	ops, _ := dialV5(t, dial(t, addr), "ops", "ops", "pw-o")
	retain := func(topic string) {
		ops.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.PUBLISH, Flags: 2 | 1},
			Content: &packets.Publish{QoS: 1, Retain: true, PacketID: 1, Topic: topic, Payload: []byte("r"), Properties: &packets.Properties{}}})
		if ack, ok := ops.read().Content.(*packets.Puback); !ok || ack.ReasonCode != 0 {
			t.Fatalf("retained on %s: no PUBACK 0", topic)
		}
	}
	retain("secret/retained")
	retain("public/retained")

	dash, code := dialV5(t, dial(t, addr), "dash", "dash", "pw-d")
	if code != 0 {
		t.Fatalf("dash: CONNACK %#x", code)
	}
	for _, tc := range []struct {
		filter string
		want   byte
	}{
		{"secret/#", 0x87},
		{"secret/x", 0x87},
		{"secret/+/y", 0x87},
		{"$share/g/secret/#", 0x87},
		{"secret", 0x87}, // secret/# covers its parent level
		{"+/x", 1},       // reads secret/x too: granted, and filtered
		{"#", 1},
	} {
		if got := dash.subscribe(uint16(len(tc.filter)), tc.filter); got != tc.want {
			t.Errorf("MQTT 5 SUBSCRIBE %s: SUBACK %#x, want %#x", tc.filter, got, tc.want)
		}
	}
	// The retained messages "#" matched: only the one not denied.
	if got := v5Topics(dash, "public/retained"); strings.Join(got, " ") != "public/retained" {
		t.Errorf("retained messages sent on #: %v, want only public/retained", got)
	}

	d3 := dial(t, addr)
	defer d3.Close()
	d3.Write(v3Connect("dash3", "dash", "pw-d"))
	if f, err := readFrame(d3); err != nil || len(f) != 3 || f[2] != 0 {
		t.Fatalf("3.1.1 dash: CONNACK %x (%v)", f, err)
	}
	for i, tc := range []struct {
		filter string
		want   byte
	}{
		{"secret/#", 0x80},
		{"#", 0},
	} {
		d3.Write(v3Subscribe(uint16(i+1), tc.filter))
		for {
			f, err := readFrame(d3)
			if err != nil {
				t.Fatalf("3.1.1 SUBSCRIBE %s: %v", tc.filter, err)
			}
			if f[0] != 0x90 {
				continue // a retained message
			}
			if len(f) != 4 || f[3] != tc.want {
				t.Errorf("3.1.1 SUBSCRIBE %s: SUBACK %x, want return code %#x", tc.filter, f, tc.want)
			}
			break
		}
	}
	v3Topics(t, d3, "public/retained")

	for i, topic := range []string{"secret/x", "public/x", "secret/y/z", "secret", "public/end"} {
		if code := ops.publish(uint16(10+i), topic, "1"); code != 0 {
			t.Fatalf("admin publish %s: PUBACK %#x", topic, code)
		}
	}
	// dash is subscribed to "+/x" and "#": public/x comes on either.
	for _, got := range [][]string{v5Topics(dash, "public/end"), v3Topics(t, d3, "public/end")} {
		for _, topic := range got {
			if strings.HasPrefix(topic, "secret") {
				t.Errorf("subscriber sent %s (its topics: %v); secret/# is denied", topic, got)
			}
		}
		if !strings.Contains(strings.Join(got, " "), "public/x") {
			t.Errorf("subscriber's topics %v: public/x missing", got)
		}
	}

	// Publications from a client of the role that subscribes to nothing
	// (its own would come back to it before the PUBACK).
	pub, _ := dialV5(t, dial(t, addr), "dash-pub", "dash", "pw-d")
	for _, tc := range []struct {
		topic string
		want  byte
	}{
		{"secret/x", 0x87},
		{"secret", 0x87},
		{"door/locked", 0x87},
		{"public/x", 0},
		{"door/open", 0},
	} {
		if got := pub.publish(uint16(20+len(tc.topic)), tc.topic, "1"); got != tc.want {
			t.Errorf("PUBLISH %s: PUBACK %#x, want %#x", tc.topic, got, tc.want)
		}
	}
	if n := refused(t, gw, "subscribe_not_authorized", 6); n != 6 {
		t.Errorf("subscribe_not_authorized: %d, want 6 (5 MQTT 5, 1 3.1.1)", n)
	}
	if n := refused(t, gw, "publish_not_authorized", 3); n != 3 {
		t.Errorf("publish_not_authorized: %d, want 3", n)
	}
}

// TestACLDenyAway: the messages queued for a persistent session while its
// client is away are sent when it returns; those on denied topics are not
// queued.
func TestACLDenyAway(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.AllowAnonymous = false
	cfg.MQTT.UsersFile = writeUsers(t, map[string]string{"dash": "pw-d", "ops": "pw-o"})
	cfg.MQTT.ACL.Users = map[string]string{"dash": "dash", "ops": "admin"}
	cfg.MQTT.ACL.Roles = map[string]configs.Role{"dash": {Subscribe: []string{"#"}, DenySubscribe: []string{"secret/#"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	addr := gw.Addr()

	persistent := func(clean bool) *v5 {
		c, code := connectV5(t, dial(t, addr), &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "dash", CleanStart: clean,
			KeepAlive: 30, UsernameFlag: true, Username: "dash", PasswordFlag: true, Password: []byte("pw-d"),
			Properties: &packets.Properties{SessionExpiryInterval: ptr(uint32(3600))}})
		if code != 0 {
			t.Fatalf("dash: CONNACK %#x", code)
		}
		return c
	}
	dash := persistent(true)
	if code := dash.subscribe(1, "#"); code != 1 {
		t.Fatalf("SUBSCRIBE #: SUBACK %#x", code)
	}
	dash.write(&packets.ControlPacket{FixedHeader: packets.FixedHeader{Type: packets.DISCONNECT}, Content: &packets.Disconnect{Properties: &packets.Properties{}}})
	if !closed(dash.conn) {
		t.Fatal("not disconnected")
	}
	ops, _ := dialV5(t, dial(t, addr), "ops", "ops", "pw-o")
	for i, topic := range []string{"secret/x", "public/x", "secret/y"} {
		if code := ops.publish(uint16(i+1), topic, "1"); code != 0 {
			t.Fatalf("admin publish %s: PUBACK %#x", topic, code)
		}
	}
	dash = persistent(false)
	if !dash.connack.SessionPresent {
		t.Fatal("session not present")
	}
	if code := ops.publish(9, "public/end", "1"); code != 0 {
		t.Fatalf("admin publish: PUBACK %#x", code)
	}
	got := v5Topics(dash, "public/end")
	if strings.Join(got, " ") != "public/x public/end" {
		t.Errorf("sent to the returning client: %v, want public/x public/end", got)
	}
}
