package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// releaseTags are the build tags of the release builds for ARM gateways,
// as the Makefile's RELEASE_TAGS (make cross, make deb) and the ARM runs
// of the end-to-end tests use them.
const releaseTags = "nodemo,nethttpomithttp2"

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

// TestReleaseBinary runs a release build (for this machine): it says
// that it has no demo and where to run one, in the usage and when asked
// for it; it links no HTTP/2; its HTTP endpoint and emulated sensors work.
func TestReleaseBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "edgegate")
	build := exec.Command("go", "build", "-tags", releaseTags, "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	t.Run("demo", func(t *testing.T) {
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
	})
	t.Run("sensors", func(t *testing.T) {
		if out, err := exec.Command(bin, "sensors", "scan", "--bus", "emulated").Output(); err != nil || !strings.Contains(string(out), "BME280") {
			t.Errorf("sensors scan --bus emulated: %v\n%s", err, out)
		}
	})
	// net/http's HTTP/2 (h2_bundle.go) is half a MiB: nethttpomithttp2
	// leaves it out. Nothing needs it: the HTTP endpoint and the WebSocket
	// listener serve HTTP/1.1 (WebSocket needs it), edgegate status asks
	// for HTTP/1.1 only. net/http/pprof, with runtime/trace and its
	// profile parser, was a quarter of a MiB more than pprof.go.
	t.Run("left out", func(t *testing.T) {
		out, err := exec.Command("go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatalf("go tool nm: %v", err)
		}
		for line := range strings.Lines(string(out)) {
			for what, sym := range map[string]string{"HTTP/2": " T net/http.(*http2Framer)", "net/http/pprof": " T net/http/pprof.", "runtime/trace": " T runtime/trace."} {
				if strings.Contains(line, sym) {
					t.Fatalf("the release build links %s: %s", what, line)
				}
			}
		}
	})
	t.Run("http endpoint", func(t *testing.T) {
		dir := t.TempDir()
		addr := fmt.Sprintf("127.0.0.1:%d", kafkatest.FreePort(t))
		cfg := filepath.Join(dir, "edgegate.yaml")
		os.WriteFile(cfg, fmt.Appendf(nil, "gateway: {id: rel, data_dir: %s}\nmqtt: {listen: \"127.0.0.1:0\", allow_anonymous: true}\nkafka: {brokers: [\"127.0.0.1:1\"]}\nhttp: {listen: \"%s\"}\n",
			filepath.Join(dir, "data"), addr), 0o600)
		var logs strings.Builder
		gw := exec.Command(bin, "run", "--config", cfg)
		gw.Stderr = &logs
		if err := gw.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- gw.Wait() }()
		defer func() {
			gw.Process.Signal(syscall.SIGTERM)
			if err := <-exited; err != nil {
				t.Errorf("exit: %v\n%s", err, logs.String())
			}
		}()
		var body string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-exited:
				exited <- err // for the deferred check
				t.Fatalf("edgegate run exited: %v\n%s", err, logs.String())
			default:
			}
			resp, err := http.Get("http://" + addr + "/metrics")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
					t.Fatalf("/metrics: %s %s", resp.Proto, resp.Status)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/metrics not served within a minute: %v", err)
			}
		}
		for _, want := range []string{"\nedgegate_publications_total 0\n", "\ngo_goroutines ", "\nprocess_resident_memory_bytes "} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})
}
