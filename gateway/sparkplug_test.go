package gateway_test

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

func sparkplugConfig(t *testing.T, brokers []string) *configs.Config {
	cfg := testConfig(t, brokers)
	cfg.Sparkplug.Enabled = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// spClient is an MQTT 5 client (paho) that hands what it receives to got.
type spClient struct {
	t   *testing.T
	c   *paho.Client
	got chan *paho.Publish
	// the edge node's session, when it is one
	group, node string
	seq         int
}

func dialSparkplug(t *testing.T, addr, id string, will *paho.WillMessage) (*spClient, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &spClient{t: t, got: make(chan *paho.Publish, 100), group: "plant", node: id}
	s.c = paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(r paho.PublishReceived) (bool, error) { s.got <- r.Packet; return true, nil }}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := s.c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true, WillMessage: will}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.c.Disconnect(&paho.Disconnect{}) })
	return s, conn
}

func (s *spClient) subscribe(filters ...string) {
	s.t.Helper()
	var opts []paho.SubscribeOptions
	for _, f := range filters {
		opts = append(opts, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	if _, err := s.c.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: opts}); err != nil {
		s.t.Fatal(err)
	}
}

// publish sends a Sparkplug message at QoS 1 (acknowledged once journaled)
// with the edge node's next seq, and returns the PUBACK's reason code.
func (s *spClient) publish(typ, device string, at time.Time, metrics ...payload.SparkplugOut) byte {
	s.t.Helper()
	seq := s.seq
	switch typ {
	case sparkplug.NBirth:
		seq, s.seq = 0, 1
	case sparkplug.NDeath:
		seq = -1
	default:
		s.seq = (s.seq + 1) % 256
	}
	topic := sparkplug.Namespace + "/" + s.group + "/" + typ + "/" + s.node
	if device != "" {
		topic += "/" + device
	}
	pr, err := s.c.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: 1, Payload: payload.AppendSparkplug(nil, uint64(at.UnixMilli()), seq, metrics)})
	if err != nil && pr == nil {
		s.t.Fatalf("publish %s: %v", topic, err)
	}
	return pr.ReasonCode
}

// next returns the next message received.
func (s *spClient) next(what string) *paho.Publish {
	s.t.Helper()
	select {
	case p := <-s.got:
		return p
	case <-time.After(patience):
		s.t.Fatalf("no %s received", what)
		return nil
	}
}

func bdSeq(n uint64) payload.SparkplugOut {
	return payload.SparkplugOut{Name: "bdSeq", Datatype: payload.SpInt64, Kind: payload.SpLongValue, Bits: n}
}

func spDouble(name string, alias uint64, v float64, at time.Time) payload.SparkplugOut {
	m := payload.SparkplugOut{Name: name, Alias: alias, HasAlias: true, Kind: payload.SpDoubleValue, Bits: math.Float64bits(v)}
	if name != "" {
		m.Datatype = payload.SpDouble
	}
	if !at.IsZero() {
		m.Timestamp = uint64(at.UnixMilli())
	}
	return m
}

func spInt32(name string, alias uint64, v int32, at time.Time) payload.SparkplugOut {
	m := payload.SparkplugOut{Name: name, Alias: alias, HasAlias: true, Kind: payload.SpIntValue, Bits: uint64(uint32(v)), Timestamp: uint64(at.UnixMilli())}
	if name != "" {
		m.Datatype = payload.SpInt32
	}
	return m
}

func historical(m payload.SparkplugOut) payload.SparkplugOut { m.IsHistorical = true; return m }

// TestSparkplugEndToEnd: an edge node and its device publish births and
// data by alias through a real mochi listener; an unknown alias is dead
// lettered and makes the host ask for a rebirth (NCMD, received by a
// subscriber), after which the node rebirths and replays historical data,
// in order and then interleaved with live data (a revision). The
// summaries read back from kfake (read_committed) equal what the test
// computes from what it sent.
func TestSparkplugEndToEnd(t *testing.T) {
	_, brokers := kafkatest.Start(t, 3, summariesTopic, deadTopic, "edge.offsets")
	cfg := sparkplugConfig(t, brokers)
	st := startStack(t, cfg, func() time.Time { return t0 })
	at := func(s string) time.Time {
		tt, _ := time.Parse("15:04:05", s)
		return time.Date(2026, 11, 30, tt.Hour(), tt.Minute(), tt.Second(), 0, time.UTC)
	}

	host, _ := dialSparkplug(t, st.gw.Addr(), "scada", nil)
	host.subscribe("spBv1.0/STATE/gw-it", "spBv1.0/plant/NCMD/+")
	state := host.next("STATE")
	var sp struct {
		Online    bool  `json:"online"`
		Timestamp int64 `json:"timestamp"`
	}
	if err := json.Unmarshal(state.Payload, &sp); state.Topic != "spBv1.0/STATE/gw-it" || !state.Retain || err != nil || !sp.Online || sp.Timestamp != t0.UnixMilli() {
		t.Fatalf("STATE %s retain %v: %s", state.Topic, state.Retain, state.Payload)
	}

	e, _ := dialSparkplug(t, st.gw.Addr(), "line1", nil)
	node, dev := "plant/line1", "plant/line1/pump1"
	var truth []sent
	e.publish(sparkplug.NBirth, "", at("10:00:00"), bdSeq(0),
		payload.SparkplugOut{Name: "Node Control/Rebirth", Datatype: payload.SpBoolean, Kind: payload.SpBoolValue},
		spDouble("temp", 1, 20, time.Time{}),
		payload.SparkplugOut{Name: "label", Alias: 5, HasAlias: true, Datatype: payload.SpString, Kind: payload.SpStringValue})
	truth = append(truth, sent{node, "temp", "", at("10:00:00"), 20})
	e.publish(sparkplug.DBirth, "pump1", at("10:00:00"), spInt32("Motor/rpm", 2, 100, at("10:00:00")), spDouble("flow", 3, 1.5, at("10:00:00")),
		payload.SparkplugOut{Name: "running", Alias: 4, HasAlias: true, Datatype: payload.SpBoolean, Kind: payload.SpBoolValue, Bits: 1})
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:00:00"), 100}, sent{dev, "flow", "", at("10:00:00"), 1.5})
	e.publish(sparkplug.DData, "pump1", at("10:00:10"), spInt32("", 2, -5, at("10:00:10")), spDouble("", 3, 2.5, time.Time{}))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:00:10"), -5}, sent{dev, "flow", "", at("10:00:10"), 2.5})
	e.publish(sparkplug.NData, "", at("10:00:30"), spDouble("", 1, 21, time.Time{}))
	truth = append(truth, sent{node, "temp", "", at("10:00:30"), 21})
	// Alias 9 was never defined: dead-lettered, and a rebirth asked for.
	e.publish(sparkplug.DData, "pump1", at("10:00:40"), spDouble("", 9, 7, time.Time{}), spInt32("", 2, 110, at("10:00:40")))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:00:40"), 110})

	cmd := host.next("rebirth request")
	var p payload.SparkplugPayload
	if err := payload.DecodeSparkplug(cmd.Payload, &p); err != nil || cmd.Topic != "spBv1.0/plant/NCMD/line1" || len(p.Metrics) != 1 ||
		string(p.Metrics[0].Name) != "Node Control/Rebirth" || p.Metrics[0].HasAlias || p.Metrics[0].Bits != 1 {
		t.Fatalf("rebirth request %s %x: %+v, %v", cmd.Topic, cmd.Payload, p, err)
	}
	// The rebirth; then historical data in order (pump1's watermark is
	// 10:00:55: its 10:00 window is open), live data that closes it, and
	// historical data interleaved (a revision of 10:00).
	e.publish(sparkplug.NBirth, "", at("10:01:00"), bdSeq(0), spDouble("temp", 1, 22, time.Time{}))
	truth = append(truth, sent{node, "temp", "", at("10:01:00"), 22})
	e.publish(sparkplug.DBirth, "pump1", at("10:01:00"), spInt32("Motor/rpm", 2, 120, at("10:01:00")), spDouble("flow", 3, 3, at("10:01:00")))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:01:00"), 120}, sent{dev, "flow", "", at("10:01:00"), 3})
	e.publish(sparkplug.DData, "pump1", at("10:01:01"), historical(spInt32("", 2, 115, at("10:00:50"))))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:00:50"), 115})
	e.publish(sparkplug.DData, "pump1", at("10:02:10"), spInt32("", 2, 130, at("10:02:10")))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:02:10"), 130})
	e.publish(sparkplug.DData, "pump1", at("10:02:11"), historical(spInt32("", 2, 105, at("10:00:20"))))
	truth = append(truth, sent{dev, "Motor/rpm", "", at("10:00:20"), 105})

	gs := settled(t, st.gw, func(s gateway.Stats) bool { return s.Publishes == 10 })
	if s := gs.Sparkplug; s == nil || s.RebirthRequests != 1 || s.Historical != 2 || s.UnknownAliases != 1 || s.NodesOnline != 1 || s.DevicesOnline != 1 ||
		s.NotAggregated != 2 || s.Protocol != 3 || s.Messages["DDATA"] != 5 || s.SeqGaps != 0 {
		t.Fatalf("sparkplug stats %+v", gs.Sparkplug)
	}
	st.stopGW()

	want := expected(truth, time.Minute)
	msgs := kafkatest.Consume(t, brokers, summariesTopic, len(want)+1, 20*time.Second)
	highest := map[winKey]aggregate.Summary{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatalf("summary %s: %v", m.Value, err)
		}
		highest[winKey{s.Device, s.Metric, s.WindowStart.UTC()}] = s
	}
	if len(msgs) != len(want)+1 || len(highest) != len(want) {
		t.Errorf("%d summaries of %d windows, want %d windows + 1 revision", len(msgs), len(highest), len(want))
	}
	for k, w := range want {
		if g, ok := highest[k]; !ok || !sameStats(g, w) {
			t.Errorf("%v:\n got %+v\nwant %+v", k, g, w)
		}
	}
	if r := highest[winKey{dev, "Motor/rpm", at("10:00:00")}]; r.Revision != 1 || r.Late != 1 || r.Count != 5 {
		t.Errorf("rpm 10:00: revision %d, late %d, count %d; want 1, 1, 5", r.Revision, r.Late, r.Count)
	}
	dl := kafkatest.Consume(t, brokers, deadTopic, 1, 20*time.Second)
	var d map[string]any
	if err := json.Unmarshal(dl[0].Value, &d); err != nil || d["reason"] != "sparkplug_unknown_alias" || d["device"] != dev || len(dl) != 1 {
		t.Errorf("dead letters %d, first %s", len(dl), dl[0].Value)
	}
}

// TestSparkplugAliasesSurviveRestart: a restart between the births and the
// data keeps the aliases, the seq and the bdSeq (the checkpoint carries
// them: the births are before it and never replayed).
func TestSparkplugAliasesSurviveRestart(t *testing.T) {
	cfg := sparkplugConfig(t, []string{"127.0.0.1:9"})
	gw, stop := runGateway(t, cfg)
	e, conn := dialSparkplug(t, gw.Addr(), "line1", nil)
	e.publish(sparkplug.NBirth, "", t0, bdSeq(3), spDouble("temp", 1, 20, time.Time{}))
	e.publish(sparkplug.DBirth, "d1", t0, spDouble("v", 2, 1, time.Time{}))
	settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 2 })
	conn.Close()
	stop()

	gw, stop = runGateway(t, cfg)
	defer stop()
	seq := e.seq
	e, _ = dialSparkplug(t, gw.Addr(), "line1", nil)
	e.seq = seq
	e.publish(sparkplug.DData, "d1", t0, spDouble("", 2, 5, time.Time{}))
	e.publish(sparkplug.NData, "", t0, spDouble("", 1, 21, time.Time{}))
	s := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 2 }).Sparkplug
	if s.Readings != 2 || s.UnknownAliases != 0 || s.BeforeBirth != 0 || s.RebirthRequests != 0 || s.SeqGaps != 0 || s.NodesOnline != 1 ||
		s.NodeList[0].BdSeq != 3 || s.NodeList[0].Metrics != 3 {
		t.Fatalf("after the restart: %+v", s)
	}
}

// TestSparkplugDeathAndACL: with the device role, an edge node publishes
// its own topics only, never a command; a will on another node's NDEATH
// is dropped at CONNECT (mochi would send it without asking the ACL); the
// node's own will, its NDEATH, ends its session.
func TestSparkplugDeathAndACL(t *testing.T) {
	cfg := sparkplugConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ACL.AnonymousRole = "device"
	// The device role, as edgegate makes it, and reading everything, so
	// that the test sees what is routed.
	dev := cfg.Roles()["device"]
	dev.Subscribe = []string{"#"}
	cfg.MQTT.ACL.Roles = map[string]configs.Role{"device": dev}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	death := func(node string, n uint64) *paho.WillMessage {
		return &paho.WillMessage{QoS: 1, Topic: "spBv1.0/plant/NDEATH/" + node, Payload: payload.AppendSparkplug(nil, 0, -1, []payload.SparkplugOut{bdSeq(n)})}
	}
	e, conn := dialSparkplug(t, gw.Addr(), "line1", death("line1", 0))
	e.subscribe("spBv1.0/plant/NDEATH/+", "spBv1.0/plant/NDATA/line1")
	if rc := e.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("temp", 1, 20, time.Time{})); rc != 0 {
		t.Fatalf("own NBIRTH refused: %#x", rc)
	}
	other := &spClient{t: t, c: e.c, group: "plant", node: "line2"}
	if rc := other.publish(sparkplug.NData, "", t0, spDouble("", 1, 1, time.Time{})); rc != 0x87 {
		t.Errorf("NDATA of another node: reason %#x, want 0x87 (not authorized)", rc)
	}
	if pr, err := e.c.Publish(context.Background(), &paho.Publish{Topic: "spBv1.0/plant/NCMD/line1", QoS: 1, Payload: []byte{}}); err == nil || pr.ReasonCode != 0x87 {
		t.Errorf("NCMD from an edge node: %v, %v; want 0x87", pr, err)
	}
	// line2 claims line1's NDEATH as its will, and goes away.
	before := gw.Stats().MQTTRefused["publish_not_authorized"]
	_, conn2 := dialSparkplug(t, gw.Addr(), "line2", death("line1", 0))
	conn2.Close()
	settled(t, gw, func(s gateway.Stats) bool { return s.Clients == 1 })
	// A publication after line2 is gone: were its will routed, it would
	// have come first.
	e.publish(sparkplug.NData, "", t0, spDouble("", 1, 21, time.Time{}))
	if m := e.next("own NDATA"); m.Topic != "spBv1.0/plant/NDATA/line1" {
		t.Fatalf("received %s %x: a will on another node's NDEATH was routed", m.Topic, m.Payload)
	}
	s := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 2 })
	if s.Sparkplug.NodesOnline != 1 || s.MQTTRefused["publish_not_authorized"] < before+1 {
		t.Fatalf("after the forged will: %+v, refused %v", s.Sparkplug, s.MQTTRefused)
	}
	// line1's connection breaks: its will, the NDEATH of its session.
	conn.Close()
	s = settled(t, gw, func(s gateway.Stats) bool { return s.Sparkplug.SessionsEnded == 1 })
	if sp := s.Sparkplug; sp.NodesOnline != 0 || sp.Nodes != 1 || sp.SessionsEnded != 1 || sp.StaleDeaths != 0 || !strings.Contains(sp.NodeList[0].Node, "line1") {
		t.Fatalf("after line1's will: %+v", sp)
	}
}
