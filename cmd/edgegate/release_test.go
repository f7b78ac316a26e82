package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// releaseTags are the build tags of the release builds for ARM gateways,
// as the Makefile's RELEASE_TAGS (make cross, make deb) and the ARM runs
// of the end-to-end tests use them.
const releaseTags = "nodemo"

// TestReleaseTagsInMakefile keeps releaseTags and the Makefile's
// RELEASE_TAGS the same.
func TestReleaseTagsInMakefile(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nRELEASE_TAGS := "+releaseTags+"\n") {
		t.Errorf("the Makefile does not say RELEASE_TAGS := %s", releaseTags)
	}
}

// releaseRules are what an ARM release build must not link: the demo's
// Kafka-protocol broker and second Kafka client stack (franz-go), the
// simulator and its two MQTT clients. The emulated I2C bus (chips) stays:
// sensors on "bus: emulated" work on any build.
var releaseRules = []importRule{
	{name: "release build: no kfake, franz-go, paho (the demo's), no simulator but its emulated chips", pkgs: "cmd/edgegate",
		deny:  append([]string{"github.com/twmb/franz-go/...", "firmware-sim/..."}, pahoTrees...),
		allow: []string{"firmware-sim/chips"}},
}

// TestReleaseBuildDependencies checks what the armv7 release build links.
func TestReleaseBuildDependencies(t *testing.T) {
	checkImports(t, []string{"GOOS=linux", "GOARCH=arm", "GOARM=7", "CGO_ENABLED=0"}, []string{"-tags", releaseTags},
		append(releaseRules, binaryRules...), "./cmd/edgegate")
}

// TestDemoLeftOut: a release build says that it has no demo and where to
// run one, in the usage and when asked for it; everything else is there.
func TestDemoLeftOut(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "edgegate")
	build := exec.Command("go", "build", "-tags", releaseTags, "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// The flags keep a build that has the demo from running it for long.
	out, err := exec.Command(bin, "demo", "--mqtt", "127.0.0.1:0", "--devices", "0", "--duration", "1ms").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 ||
		!strings.Contains(string(out), "edgegate: demo: not in this build. ARM release builds") ||
		!strings.Contains(string(out), "make demo, or go run ./cmd/edgegate demo") {
		t.Errorf("edgegate demo: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "help").Output(); err != nil || !strings.Contains(string(out), "edgegate demo [flags]          not in this build") {
		t.Errorf("usage: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "sensors", "scan", "--bus", "emulated").Output(); err != nil || !strings.Contains(string(out), "BME280") {
		t.Errorf("sensors scan --bus emulated: %v\n%s", err, out)
	}
}
