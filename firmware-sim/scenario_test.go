package firmwaresim_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
)

// TestScenarioFiles loads every scenario in configs/sim and checks the
// fleet each one makes against what its file says.
func TestScenarioFiles(t *testing.T) {
	files, _ := filepath.Glob("../configs/sim/*.yaml")
	want := map[string]struct{ devices, subs, offline, interleave, skewed, reorder, malformed, dup, v311, sparkplug, aliasLoss int }{
		"steady":          {300, 1, 0, 0, 0, 0, 0, 0, 150, 0, 0},
		"offline-replay":  {60, 0, 40, 10, 0, 0, 0, 0, 20, 0, 0},
		"late-and-skewed": {40, 0, 10, 10, 23, 15, 0, 0, 0, 0, 0},
		"storm":           {1000, 0, 0, 0, 0, 0, 0, 0, 500, 0, 0},
		"bad-payloads":    {20, 2, 0, 0, 0, 0, 20, 10, 0, 0, 0},
		"sparkplug":       {30, 0, 20, 5, 0, 0, 0, 0, 10, 30, 7},
		"clocks":          {24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	if len(files) != len(want) {
		t.Fatalf("scenario files %v, want %d", files, len(want))
	}
	for _, f := range files {
		s, err := firmwaresim.LoadScenario(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSuffix(filepath.Base(f), ".yaml") != s.Name {
			t.Errorf("%s: name %q", f, s.Name)
		}
		fl := s.Fleet("127.0.0.1:1883")
		var got struct{ devices, subs, offline, interleave, skewed, reorder, malformed, dup, v311, sparkplug, aliasLoss int }
		got.devices, got.subs = len(fl.Devices), len(fl.Subscribers)
		for _, d := range fl.Devices {
			if d.OfflineEvery > 0 {
				got.offline++
			}
			if d.Interleave {
				got.interleave++
			}
			if d.ClockSkew != 0 || d.ClockDrift != 0 {
				got.skewed++
			}
			if d.ReorderWithin > 0 {
				got.reorder++
			}
			if d.MalformedProb > 0 {
				got.malformed++
			}
			if d.DuplicateProb > 0 {
				got.dup++
			}
			if d.Protocol == 4 {
				got.v311++
			}
			if d.Form == firmwaresim.FormSparkplug {
				got.sparkplug++
			}
			if d.AliasLossProb > 0 {
				got.aliasLoss++
			}
		}
		if got != want[s.Name] {
			t.Errorf("%s: fleet %+v, want %+v", s.Name, got, want[s.Name])
		}
	}
}

// TestClockScenario: the clocks scenario's devices get the clocks its file
// gives, scaled with the rest.
func TestClockScenario(t *testing.T) {
	s, err := firmwaresim.LoadScenario("../configs/sim/clocks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s.Scale(10)
	type clock struct {
		unset  bool
		offset time.Duration
		stepAt time.Duration
	}
	want := map[string]clock{"esp-unset": {true, 0, 0}, "esp-sntp": {true, 0, 5 * time.Second}, "pi-stale": {false, -72 * time.Hour / 10, 7 * time.Second},
		"stale": {false, -72 * time.Hour / 10, 0}, "ahead": {false, 2 * time.Hour / 10, 6 * time.Second}, "synced": {}}
	for _, d := range s.Fleet("127.0.0.1:1883").Devices {
		group := d.ID[:strings.LastIndex(d.ID, "-")]
		if got := (clock{d.ClockUnset, d.ClockOffset, d.ClockStepAt}); got != want[group] {
			t.Errorf("%s: clock %+v, want %+v", d.ID, got, want[group])
		}
	}
}

func TestScenarioErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, qos: 3}]", "groups[0].qos: 3; use 0, 1 or 2"},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, colour: red}]", "field colour not found"},
		{"name: x\nduration: soon\ngroups: []", `"soon" is not a duration`},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, behaviours: [{fraction: 2}]}]", "behaviours[0].fraction: 2"},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, behaviours: [{fraction: 1, offline: {every: 10s, for: 20s}}]}]", "offline: want 0 < for < every"},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, protocol: '3'}]", `protocol: "3"`},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, behaviours: [{fraction: 1, clock: late}]}]", `clock: "late": use unset, stale <duration> or ahead <duration>`},
		{"name: x\nduration: 1m\ngroups: [{name: a, count: 1, interval: 1s, behaviours: [{fraction: 1, clock: stale soon}]}]", `clock: "stale soon": want stale and a positive duration`},
	} {
		if _, err := firmwaresim.ParseScenario([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	s, err := firmwaresim.ParseScenario([]byte("name: x\nduration: 90s\ngroups: [{name: a, count: 2, interval: 1s, username: '{id}', password: 'pw-{id}'}]"))
	if err != nil {
		t.Fatal(err)
	}
	f := s.Fleet("a:1")
	if d := f.Devices[1]; d.ID != "a-0002" || d.Username != "a-0002" || d.Password != "pw-a-0002" || s.Duration.D() != 90*time.Second {
		t.Errorf("device %+v", d)
	}
}
