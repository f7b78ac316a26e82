package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection keeps the arrows of ARCHITECTURE.md honest: each
// package may not depend on the packages listed for it.
func TestDependencyDirection(t *testing.T) {
	const mod = "github.com/edgegate/edgegate/"
	rules := map[string][]string{
		"aggregate":       {"github.com/", "golang.org/", "periph.io/", mod}, // standard library only
		"bridge":          {"github.com/mochi-mqtt/", "github.com/eclipse/paho", mod + "gateway"},
		"firmware-sim":    {mod + "gateway", mod + "bridge", mod + "aggregate", mod + "devices", "github.com/IBM/sarama"}, // emulators model the datasheets, not our drivers
		"gateway/payload": {"github.com/mochi-mqtt/", "github.com/IBM/sarama", mod + "bridge"},
		"gateway":         {mod + "firmware-sim"},
	}
	for pkg, banned := range rules {
		out, err := exec.Command("go", "list", "-deps", "./../../"+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == mod+pkg || strings.HasPrefix(dep, "vendor/") {
				continue
			}
			for _, b := range banned {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
