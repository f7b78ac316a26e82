package gateway_test

import (
	"testing"

	"github.com/eclipse/paho.golang/packets"

	"github.com/edgegate/edgegate/configs"
)

// TestServerKeepAlive: with the default mqtt.max_keep_alive, an MQTT 5
// client asking for a longer keep alive, or none, is told the default in
// its CONNACK (Server Keep Alive, [MQTT-3.2.2-21]); one asking for the
// default or less, as common clients do (60 s), is told nothing.
func TestServerKeepAlive(t *testing.T) {
	def := uint16(configs.Default().MQTT.MaxKeepAlive.D().Seconds())
	if def != 120 {
		t.Errorf("default mqtt.max_keep_alive %d s, want 120 s: twice the common clients' 60 s, a vanished device noticed within 3 min", def)
	}
	gw, stop := runGateway(t, testConfig(t, []string{"127.0.0.1:9"}))
	defer stop()
	for _, tc := range []struct {
		ask  uint16
		want uint16 // 0: no Server Keep Alive
	}{
		{300, def}, // a long keep alive (a battery device's)
		{3600, def},
		{0, def},
		{def + 1, def},
		{def, 0},
		{60, 0},
		{1, 0},
	} {
		c, code := connectV5(t, dial(t, gw.Addr()), &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: "ka",
			CleanStart: true, KeepAlive: tc.ask, Properties: &packets.Properties{}})
		if code != 0 {
			t.Fatalf("keep alive %d: CONNACK %#x", tc.ask, code)
		}
		var got uint16
		if p := c.connack.Properties; p != nil && p.ServerKeepAlive != nil {
			got = *p.ServerKeepAlive
		}
		if got != tc.want {
			t.Errorf("asking keep alive %d s: Server Keep Alive %d, want %d (0: none)", tc.ask, got, tc.want)
		}
		c.conn.Close()
	}
}
