package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
)

// TestSenMLDeviceIsThePublisher: on a topic that does not name the device
// (pattern "senml"), SenML's bn does. A device (here dev-1, and an
// anonymous one) may only publish readings of its own device: a pack
// naming another is dead-lettered as device_not_allowed and counted,
// never aggregated; an admin may publish for any device.
func TestSenMLDeviceIsThePublisher(t *testing.T) {
	cfg := sessionConfig(t)
	cfg.MQTT.Topics = append(cfg.MQTT.Topics, "senml")
	cfg.MQTT.AllowAnonymous, cfg.MQTT.ACL.AnonymousRole = true, "device"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pack := func(dev string) string {
		return fmt.Sprintf(`[{"bn":"%s:","n":"temp","v":21.5},{"n":"rh","v":40}]`, dev)
	}
	gw, stop := runGateway(t, cfg)
	defer stop()
	dev1, _ := dialV5(t, dial(t, gw.Addr()), "dev-1", "dev-1", "pw-1")
	ops, _ := dialV5(t, dial(t, gw.Addr()), "ops", "ops", "pw-o")
	anon, _ := dialV5(t, dial(t, gw.Addr()), "dev-a", "", "")
	for _, tc := range []struct {
		name string
		c    *v5
		dev  string
	}{
		{"dev-1 as itself", dev1, "dev-1"},           // 2 readings aggregated
		{"dev-1 as dev-2", dev1, "dev-2"},            // 2 refused
		{"anonymous dev-a as dev-2", anon, "dev-2"},  // 2 refused
		{"anonymous dev-a as itself", anon, "dev-a"}, // 2 aggregated
		{"admin as dev-2", ops, "dev-2"},             // 2 aggregated
	} {
		if code := tc.c.publish(uint16(len(tc.name)), "senml", pack(tc.dev)); code != 0 {
			t.Errorf("%s: PUBACK %#x, want 0 (the reading is durable; its device is decided when applied)", tc.name, code)
		}
	}
	st := settled(t, gw, func(st gateway.Stats) bool { return st.Outcomes["aggregated"] >= 6 && st.NotAllowed >= 4 })
	if st.Outcomes["aggregated"] != 6 || st.NotAllowed != 4 {
		t.Errorf("%d readings aggregated, %d refused as device_not_allowed; want 6, 4", st.Outcomes["aggregated"], st.NotAllowed)
	}
	for _, d := range st.DeviceList {
		if d.ID == "dev-2" && d.Aggregated != 2 {
			t.Errorf("dev-2 has %d readings, want the admin's 2", d.Aggregated)
		}
	}
}

// TestReplayDecidesTheDevice: the applier decides from the journal record
// alone, so replay decides as the first run did: a record that names its
// publisher's device (journal.FlagDevice) keeps readings of that device
// only; one without (a record of an older journal, an admin's, the
// gateway's own sensors) keeps all.
func TestReplayDecidesTheDevice(t *testing.T) {
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.Topics = append(cfg.MQTT.Topics, "senml")
	g, err := gateway.New(cfg.GatewayOptions(nil), &switchOutput{}, quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer g.CloseFiles()
	at := time.Now().UnixNano()
	pack := []byte(`[{"bn":"dev-2:","n":"temp","v":21.5},{"n":"rh","v":40}]`)
	g.ApplyBatch(1, [][]byte{
		journal.AppendPublishAs(nil, at, 1, 1, "dev-1", "dev-1", "senml", pack), // refused: 2
		journal.AppendPublishAs(nil, at, 1, 2, "dev-2", "dev-2", "senml", pack), // its own: 2
		journal.AppendPublish(nil, at, 1, 3, "dev-1", "senml", pack),            // no device named: 2
	})
	if st := g.Stats(); st.Outcomes["aggregated"] != 4 || st.NotAllowed != 2 {
		t.Errorf("%d readings aggregated, %d refused; want 4, 2", st.Outcomes["aggregated"], st.NotAllowed)
	}
}
