package configs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// loadIn parses a configuration whose data_dir is dir, with extra YAML
// for the gateway section.
func loadIn(t *testing.T, dir, gateway string) *Config {
	t.Helper()
	c, err := Parse([]byte("gateway: {data_dir: " + dir + gateway + "}\nmqtt: {users_file: u}\nkafka: {brokers: ['k:9092']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func resolve(t *testing.T, c *Config) GatewayID {
	t.Helper()
	g, err := c.ResolveGatewayID()
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.ID != g.ID {
		t.Errorf("config's gateway.id %q, resolved %q", c.Gateway.ID, g.ID)
	}
	if b, err := os.ReadFile(filepath.Join(c.Gateway.DataDir, GatewayIDFile)); err != nil || string(b) != g.ID+"\n" {
		t.Errorf("%s holds %q (%v), want %q", GatewayIDFile, b, err, g.ID+"\n")
	}
	return g
}

func setHostname(t *testing.T, name string) {
	t.Helper()
	old := hostname
	hostname = func() (string, error) { return name, nil }
	t.Cleanup(func() { hostname = old })
}

// TestClonesGetTheirOwnID: two gateways cloned from one SD card image
// share the host name raspberrypi. Without gateway.id each makes its own
// id at its first start (the old default, the host name, was the same
// for both), and keeps it across restarts and a change of host name.
func TestClonesGetTheirOwnID(t *testing.T) {
	setHostname(t, "raspberrypi")
	form := regexp.MustCompile(`^raspberrypi-[0-9a-f]{10}$`)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := resolve(t, loadIn(t, dirA, "")), resolve(t, loadIn(t, dirB, ""))
	if !form.MatchString(a.ID) || !form.MatchString(b.ID) || a.ID == b.ID || a.From != "generated" || b.From != "generated" {
		t.Errorf("clones' ids %+v and %+v; want two different raspberrypi-<10 hex>, generated", a, b)
	}
	if again := resolve(t, loadIn(t, dirA, "")); again.ID != a.ID || again.From != "stored" {
		t.Errorf("after a restart: %+v, want %s stored", again, a.ID)
	}
	setHostname(t, "hall-3")
	if renamed := resolve(t, loadIn(t, dirA, "")); renamed.ID != a.ID {
		t.Errorf("after the host was renamed: %+v, want %s", renamed, a.ID)
	}
}

// TestUpgradeKeepsHostName: a data directory used by a version whose
// default id was the host name (a queue in outbound/, no gateway-id file)
// keeps the host name, sanitized, as before: its Kafka transactional id
// and delivered position depend on it. From then on it is stored.
func TestUpgradeKeepsHostName(t *testing.T) {
	for _, sub := range []string{"outbound", "ingest", "state"} {
		t.Run(sub, func(t *testing.T) {
			setHostname(t, "pi at hall 3")
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, sub, "00000000000000000001.seg"), nil, 0o640); err != nil {
				t.Fatal(err)
			}
			if g := resolve(t, loadIn(t, dir, "")); g.ID != "pi-at-hall-3" || g.From != "host name" {
				t.Errorf("upgraded: %+v, want pi-at-hall-3 from the host name", g)
			}
			setHostname(t, "renamed")
			if g := resolve(t, loadIn(t, dir, "")); g.ID != "pi-at-hall-3" || g.From != "stored" {
				t.Errorf("after a rename: %+v, want pi-at-hall-3 stored", g)
			}
		})
	}
	// An empty queue directory (made by a start that stopped at once) is
	// no history: a new id.
	setHostname(t, "raspberrypi")
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "outbound"), 0o750)
	if g := resolve(t, loadIn(t, dir, "")); g.From != "generated" {
		t.Errorf("empty outbound/: %+v, want a generated id", g)
	}
}

// TestExplicitGatewayID: gateway.id is used as set and recorded, so that
// unsetting it later keeps it; changing it says what it was.
func TestExplicitGatewayID(t *testing.T) {
	setHostname(t, "raspberrypi")
	dir := t.TempDir()
	if g := resolve(t, loadIn(t, dir, ", id: gw-01")); g.ID != "gw-01" || g.From != "gateway.id" || g.Was != "" {
		t.Errorf("set: %+v", g)
	}
	if g := resolve(t, loadIn(t, dir, "")); g.ID != "gw-01" || g.From != "stored" {
		t.Errorf("unset after: %+v, want gw-01 stored", g)
	}
	if g := resolve(t, loadIn(t, dir, ", id: gw-02")); g.ID != "gw-02" || g.Was != "gw-01" {
		t.Errorf("changed: %+v, want gw-02, was gw-01", g)
	}
}

// TestGatewayIDLimits: a long host name still makes an id of at most 64
// characters; an unreadable id file is an error naming it and the fix.
func TestGatewayIDLimits(t *testing.T) {
	setHostname(t, strings.Repeat("h", 80))
	g := resolve(t, loadIn(t, t.TempDir(), ""))
	if len(g.ID) != 64 || !idRE.MatchString(g.ID) {
		t.Errorf("id %q (%d characters)", g.ID, len(g.ID))
	}
	dir := t.TempDir()
	file := filepath.Join(dir, GatewayIDFile)
	if err := os.WriteFile(file, []byte("not an id!\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := loadIn(t, dir, "").ResolveGatewayID()
	want := "gateway.id: " + file + ` holds "not an id!", not a gateway id; put back the id this gateway had, or set gateway.id`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("ResolveGatewayID = %v, want %q...", err, want)
	}
}
