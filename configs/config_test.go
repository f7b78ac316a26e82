package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

func TestGoodConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.good.yaml")
	files = append(files, "edgegate.yaml")
	if len(files) < 3 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			c, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			// The effective config must load back to the same thing.
			out, err := c.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("effective config does not load back: %v\n%s", err, out)
			}
			out2, _ := back.Marshal()
			if string(out) != string(out2) {
				t.Errorf("round trip changed the config:\n%s\n---\n%s", out, out2)
			}
		})
	}
}

func TestFullConfigValues(t *testing.T) {
	c, err := Load("testdata/full.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := c.AggregateConfig()
	if a.Gateway != "gw.hall-3_b" || a.Window != 10*time.Second || a.MaxOutOfOrder != 2*time.Second ||
		a.IdleClose != 30*time.Second || a.AllowedLateness != time.Hour || a.MaxFutureSkew != 30*time.Second || a.MaxRetained != 10 ||
		a.UntrustedDeviceTime != aggregate.UntrustedDeadLetter || a.MaxDeviceSkew != 30*time.Second || a.TimeFloor.Before(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("aggregate config = %+v", a)
	}
	if c.MQTT.Listen != "127.0.0.1:1884" || c.MQTT.Topics[0] != "plant/{device}/m/{metric}" || len(c.Kafka.Brokers) != 2 ||
		c.Kafka.SummariesTopic != "s" || c.HTTP.Listen != "" || c.Log.Format != "json" {
		t.Errorf("config = %+v", c)
	}
	if o := c.GatewayOptions(nil); c.Clock.Synchronized != "always" || o.HoldMaxBytes != 1<<20 || o.HoldMaxAge != 10*time.Minute {
		t.Errorf("clock = %+v", c.Clock)
	}
	if c.Storage.MaxBytes != 64<<20 || c.Storage.FullPolicy != "drop_oldest" {
		t.Errorf("storage = %+v", c.Storage)
	}
	// Keys the file leaves out keep their defaults.
	if d := Default(); c.MQTT.ClientWriteQueue != d.MQTT.ClientWriteQueue || c.Kafka.ClientID != "edgegate" {
		t.Errorf("defaults lost: %+v", c.MQTT)
	}
}

func TestBadConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(f, ".yaml") + ".err")
			if err != nil {
				t.Fatal(err)
			}
			_, err = Load(f)
			if err == nil {
				t.Fatal("loaded without error")
			}
			wantMsg := "config " + f + ": " + strings.TrimSpace(string(want))
			if err.Error() != wantMsg {
				t.Errorf("error:\n got %s\nwant %s", err, wantMsg)
			}
		})
	}
}

func TestCheckFiles(t *testing.T) {
	c, err := Load("testdata/minimal.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.MQTT.UsersFile = filepath.Join(t.TempDir(), "missing")
	if err := c.CheckFiles(); err == nil || !strings.HasPrefix(err.Error(), "mqtt.users_file: ") {
		t.Errorf("CheckFiles = %v, want an error naming mqtt.users_file", err)
	}
}

func TestSensorsConfig(t *testing.T) {
	c, err := Load("testdata/sensors.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Sensors[0]
	if len(c.Sensors) != 3 || s.Address != 0x76 || s.Driver != "bme280" || s.Every.D() != 10*time.Second || s.Metrics["temperature"] != "temp_c" {
		t.Errorf("sensors = %+v", c.Sensors)
	}
	if topic, ok := c.SensorTopic("gw-board", "temp_c"); !ok || topic != "sensors/gw-board/temp_c" {
		t.Errorf("topic %q %v", topic, ok)
	}
}

func TestRolesFollowTopics(t *testing.T) {
	c, err := Load("testdata/full.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := c.Roles()
	if got := strings.Join(r["device"].Publish, " "); got != strings.Join(wantDevicePublish(c.MQTT.Topics), " ") {
		t.Errorf("device publish = %q", got)
	}
	if got := strings.Join(r["subscriber"].Subscribe, " "); !strings.Contains(got, "plant/+/m/+") {
		t.Errorf("subscriber subscribe = %q", got)
	}
	if r["admin"].Subscribe[1] != "$SYS/#" {
		t.Errorf("admin = %+v", r["admin"])
	}
}

// wantDevicePublish spells out the device role for the topics of
// full.good.yaml.
func wantDevicePublish(topics []string) []string {
	want := map[string]string{"plant/{device}/m/{metric}": "plant/{username}/m/+", "plant/{device}": "plant/{username}"}
	var out []string
	for _, t := range topics {
		out = append(out, want[t])
	}
	return out
}

func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		{"mqtt: {listen: '127.0.0.1:1883', users_file: u}", nil},
		{"mqtt: {listen: 'localhost:1883', users_file: u}", nil},
		{"mqtt: {listen: '[::1]:1883', users_file: u}", nil},
		{"mqtt: {listen: '0.0.0.0:1883', users_file: u}", []string{"mqtt.listen"}},
		{"mqtt: {listen: ':1883', users_file: u}", []string{"mqtt.listen"}},
		{"mqtt: {listen: '0.0.0.0:1883', allow_anonymous: true}", []string{"mqtt.listen", "mqtt.allow_anonymous"}},
		{"mqtt: {listen: '127.0.0.1:1883', allow_anonymous: true}", nil},
		{"mqtt: {listen: '127.0.0.1:1883', allow_anonymous: true, acl: {anonymous_role: admin}}", []string{"mqtt.acl.anonymous_role"}},
		{"mqtt: {listen: '127.0.0.1:1883', users_file: u, acl: {anonymous_role: admin}}", nil}, // nobody is anonymous
		{"mqtt: {listen: '127.0.0.1:1883', users_file: u, device_client_ids: any}", []string{"mqtt.device_client_ids"}},
		{"mqtt: {listen: '127.0.0.1:1883', users_file: u, websocket: {listen: '127.0.0.1:8884', allowed_origins: ['*']}}", []string{"mqtt.websocket.allowed_origins"}},
		{"mqtt: {listen: '127.0.0.1:1883', users_file: u, websocket: {listen: '127.0.0.1:8884', allowed_origins: ['https://d.example']}}", nil},
		{"mqtt: {listen: '', users_file: u, tls: {listen: '0.0.0.0:8883', cert_file: c, key_file: k}, websocket: {listen: '0.0.0.0:8884'}}", []string{"mqtt.websocket.listen"}},
	} {
		c, err := Parse([]byte(tc.yaml + "\nkafka: {brokers: ['k:9092']}\n"))
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		var keys []string
		for _, w := range c.Warnings() {
			keys = append(keys, w[:strings.Index(w, ":")])
		}
		if strings.Join(keys, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: warnings %q, want keys %q", tc.yaml, c.Warnings(), tc.want)
		}
	}
}

func TestSparkplugConfig(t *testing.T) {
	c, err := Load("testdata/sparkplug.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := c.GatewayOptions(nil).Sparkplug
	if o == nil || o.HostID != "scada-1" || len(o.Groups) != 2 || o.Groups[1] != "Plant B" || o.RebirthInterval != 30*time.Second ||
		o.Separator != ":" || !o.Booleans || o.MaxNodes != 50 || o.MaxMetricsPerNode != 2000 ||
		o.MaxDevicesPerNode != 20 || o.MaxMetrics != 5000 || o.ForgetAfter != 2*time.Hour {
		t.Fatalf("sparkplug options %+v", o)
	}
	dev := c.Roles()["device"]
	has := func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	for _, f := range []string{"spBv1.0/+/NBIRTH/{username}", "spBv1.0/+/NDEATH/{username}", "spBv1.0/+/DDATA/{username}/+"} {
		if !has(dev.Publish, f) {
			t.Errorf("device role cannot publish %s: %v", f, dev.Publish)
		}
	}
	for _, f := range []string{"spBv1.0/+/NCMD/{username}/#", "spBv1.0/+/DCMD/{username}/#", "spBv1.0/STATE/scada-1"} {
		if !has(dev.Subscribe, f) {
			t.Errorf("device role cannot subscribe %s: %v", f, dev.Subscribe)
		}
	}
	for _, f := range dev.Publish {
		if strings.Contains(f, "CMD") || strings.Contains(f, "STATE") {
			t.Errorf("device role may publish %s: commands and STATE are the host's", f)
		}
	}
	// Off (the default): no Sparkplug options, no Sparkplug filters; the
	// host id defaults to the gateway id.
	d := Default()
	d.Gateway.ID = "gw-7"
	if d.GatewayOptions(nil).Sparkplug != nil || d.SparkplugHostID() != "gw-7" {
		t.Fatalf("default sparkplug options %+v, host id %s", d.GatewayOptions(nil).Sparkplug, d.SparkplugHostID())
	}
	for _, f := range d.Roles()["device"].Publish {
		if strings.HasPrefix(f, "spBv1.0") {
			t.Errorf("device role has %s with sparkplug off", f)
		}
	}
}
