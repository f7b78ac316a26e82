package gateway_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/clock"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sparkplug"
	"periph.io/x/conn/v3/i2c/i2creg"
)

// boundsConfig is a Sparkplug gateway with small bounds, whose anonymous
// clients are of the device role (their identity is their client id).
func boundsConfig(t *testing.T, tweak func(*configs.Config)) *configs.Config {
	cfg := sparkplugConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.ACL.AnonymousRole = "device"
	cfg.Sparkplug.MaxNodes = 10
	cfg.Aggregate.MaxDevices = 20
	cfg.Sparkplug.MaxDevicesPerNode = 8
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func hasDevice(s gateway.Stats, name string) bool {
	return slices.ContainsFunc(s.DeviceList, func(d aggregate.DeviceStat) bool { return d.ID == name })
}

func nodeOf(s *sparkplug.Stats, group, node string) *sparkplug.NodeStat {
	for i := range s.NodeList {
		if n := &s.NodeList[i]; n.Group == group && n.Node == node {
			return n
		}
	}
	return nil
}

// TestSparkplugIdentityBound: a device identity ("evil", allowed to
// publish as edge node evil in any group) births its node in 50 groups
// and 60 devices under one of them; a legitimate edge node (line1) then
// births with a device. The identity holds one edge node and a bounded
// number of devices, the rest refused and counted; line1 and its device
// are unaffected, and so after a restart of the gateway from its data
// directory, where the identity's binding holds.
func TestSparkplugIdentityBound(t *testing.T) {
	cfg := boundsConfig(t, nil)
	gw, stop := runGateway(t, cfg)
	evil, evilConn := dialSparkplug(t, gw.Addr(), "evil", nil)
	for g := range 50 {
		evil.group = fmt.Sprintf("g%02d", g)
		evil.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("x", 1, 1, time.Time{}))
	}
	evil.group, evil.seq = "g00", 1
	for d := range 60 {
		evil.publish(sparkplug.DBirth, fmt.Sprintf("d%02d", d), t0, spDouble("v", uint64(100+d), 1, t0))
	}
	line1, line1Conn := dialSparkplug(t, gw.Addr(), "line1", nil)
	line1.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("temp", 1, 20, t0))
	line1.publish(sparkplug.DBirth, "pump1", t0, spDouble("flow", 2, 1.5, t0))
	s := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 112 })
	check := func(when string, s gateway.Stats) {
		t.Helper()
		sp := s.Sparkplug
		if n := nodeOf(sp, "plant", "line1"); n == nil || !n.Online || len(n.Devices) != 1 || !n.Devices[0].Online {
			t.Errorf("%s: line1 %+v; nodes %d, too many nodes %d", when, n, sp.Nodes, sp.TooManyNodes)
		}
		if !hasDevice(s, "plant/line1/pump1") || !hasDevice(s, "plant/line1") {
			t.Errorf("%s: line1's readings not aggregated: %d devices, dead letters %v", when, s.Devices, s.DeadLetters)
		}
		if sp.Nodes != 2 || sp.TooManyNodes != 0 {
			t.Errorf("%s: %d edge nodes (want line1 and evil's one), %d refused as too many", when, sp.Nodes, sp.TooManyNodes)
		}
		if s.Devices > 2+1+8 { // line1 and pump1, evil's node and its devices
			t.Errorf("%s: the aggregator holds %d devices", when, s.Devices)
		}
	}
	check("before the restart", s)
	if sp := s.Sparkplug; sp.IdentityBound != 49 || sp.TooManyDevices != 52 || s.Rejected[payload.ReasonIdentityBound] != 49 {
		t.Errorf("refusals counted: identity bound %d, too many devices %d; rejected %v", sp.IdentityBound, sp.TooManyDevices, s.Rejected)
	}
	evilConn.Close()
	line1Conn.Close()
	stop()

	gw, stop = runGateway(t, cfg)
	defer stop()
	evil, _ = dialSparkplug(t, gw.Addr(), "evil", nil)
	evil.group = "g07"
	evil.publish(sparkplug.NBirth, "", t0, bdSeq(1), spDouble("x", 1, 1, time.Time{}))
	seq := line1.seq
	line1, _ = dialSparkplug(t, gw.Addr(), "line1", nil)
	line1.seq = seq
	line1.publish(sparkplug.DData, "pump1", t0.Add(time.Second), spDouble("", 2, 2.5, t0.Add(time.Second)))
	s = settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 2 })
	check("after the restart", s)
	if sp := s.Sparkplug; sp.Readings != 1 || sp.UnknownAliases != 0 || sp.BeforeBirth != 0 || sp.IdentityBound != 1 {
		t.Errorf("after the restart: line1's DDATA: %+v", sp)
	}
}

// runGatewayOn is runGateway on a clock moved by hand.
func runGatewayOn(t *testing.T, cfg *configs.Config, clk *clock.Manual) (*gateway.Gateway, func()) {
	t.Helper()
	o := cfg.GatewayOptions(i2creg.Open)
	o.Clock = clk
	gw, err := gateway.New(o, &switchOutput{}, quietLog(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	return gw, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway: %v", err)
		}
	}
}

// TestSparkplugForgetsDeadNodes: an edge node with a device dies (its
// NDEATH); nothing else happens. Within sparkplug.forget_after (the
// default, 24 h) of the gateway's journaled clock it stays listed,
// offline; past it, the tick that the gateway journals forgets it, and its
// device, in the host and the aggregator, counted with the reason; the
// checkpoint no longer holds it (a restart restores the live node alone).
func TestSparkplugForgetsDeadNodes(t *testing.T) {
	cfg := boundsConfig(t, nil)
	clk := clock.NewManual(t0, true)
	gw, stop := runGatewayOn(t, cfg, clk)
	line1, _ := dialSparkplug(t, gw.Addr(), "line1", nil)
	line1.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("temp", 1, 20, t0))
	line1.publish(sparkplug.DBirth, "pump1", t0, spDouble("flow", 2, 1.5, t0))
	line2, _ := dialSparkplug(t, gw.Addr(), "line2", nil)
	line2.publish(sparkplug.NBirth, "", t0, bdSeq(0), spDouble("temp", 1, 20, t0))
	line1.publish(sparkplug.NDeath, "", t0, bdSeq(0))
	s := settled(t, gw, func(s gateway.Stats) bool { return s.Publishes == 4 })
	if sp := s.Sparkplug; sp.Nodes != 2 || sp.NodesOnline != 1 || sp.SessionsEnded != 1 {
		t.Fatalf("after line1's NDEATH: %+v", sp)
	}
	// Windows close by idle close; the devices are silent.
	clk.Advance(23 * time.Hour)
	s = settled(t, gw, func(s gateway.Stats) bool { return s.OpenWindows == 0 })
	if sp := s.Sparkplug; sp.Nodes != 2 || !hasDevice(s, "plant/line1/pump1") {
		t.Fatalf("line1 forgotten before the horizon: %+v, %d devices", sp, s.Devices)
	}
	clk.Advance(2 * time.Hour)
	s = settled(t, gw, func(s gateway.Stats) bool { return s.Sparkplug.Nodes == 1 })
	if sp := s.Sparkplug; sp.Nodes != 1 || nodeOf(sp, "plant", "line2") == nil || sp.Forgotten["node_dead"] != 1 {
		t.Fatalf("past the horizon: %+v", sp)
	}
	if hasDevice(s, "plant/line1/pump1") || hasDevice(s, "plant/line1") || !hasDevice(s, "plant/line2") {
		t.Errorf("past the horizon the aggregator holds %+v", s.DeviceList)
	}
	stop()

	gw, stop = runGatewayOn(t, cfg, clk)
	defer stop()
	s = gw.Stats()
	if sp := s.Sparkplug; sp.Nodes != 1 || nodeOf(sp, "plant", "line2") == nil || hasDevice(s, "plant/line1/pump1") {
		t.Fatalf("after a restart: %+v, devices %+v", sp, s.DeviceList)
	}
}
