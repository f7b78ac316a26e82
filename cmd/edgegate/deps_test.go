package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// importRule says what the packages under it may depend on, directly or
// not: with only set, the standard library and allow and nothing else;
// otherwise anything but deny, where allow makes exceptions. Patterns are
// import paths relative to the module ("x" is x, "x/..." is x and every
// package below it); a path with a dot is outside the module.
type importRule struct {
	name  string // the rule, as a failure states it
	pkgs  string
	only  bool
	allow []string
	deny  []string
}

var (
	saramaTree = "github.com/IBM/sarama/..."
	mochiTree  = "github.com/mochi-mqtt/server/v2/..."
	pahoTrees  = []string{"github.com/eclipse/paho.golang/...", "github.com/eclipse/paho.mqtt.golang/..."}
)

// importRules are the arrows of ARCHITECTURE.md: dependencies point down
// the data flow, and the core packages do no I/O of their own.
var importRules = []importRule{
	{name: "aggregate: standard library only", pkgs: "aggregate/...", only: true},
	{name: "bridge/queue: standard library only", pkgs: "bridge/queue/...", only: true},
	{name: "devices: periph.io/x/conn only", pkgs: "devices/...", only: true,
		allow: []string{"periph.io/x/conn/v3/...", "devices/..."}},
	{name: "gateway: not bridge (bridge/queue aside), configs, sarama, firmware-sim", pkgs: "gateway/...",
		deny: []string{"bridge/...", "configs/...", saramaTree, "firmware-sim/..."}, allow: []string{"bridge/queue/..."}},
	{name: "gateway/payload: not mochi, sarama, bridge", pkgs: "gateway/payload/...",
		deny: []string{mochiTree, saramaTree, "bridge/..."}},
	{name: "bridge: not mochi, paho, gateway", pkgs: "bridge/...",
		deny: append([]string{mochiTree, "gateway/..."}, pahoTrees...)},
	{name: "bridge: sarama only in bridge/kafka", pkgs: "bridge", deny: []string{saramaTree}},
	{name: "bridge/summary: not sarama, the rest of bridge", pkgs: "bridge/summary/...",
		deny: []string{saramaTree, "bridge/..."}, allow: []string{"bridge/summary/..."}},
	// The emulators model the datasheets, not our drivers.
	{name: "firmware-sim: not gateway, bridge, aggregate, devices, sarama", pkgs: "firmware-sim/...",
		deny: []string{"gateway/...", "bridge/...", "aggregate/...", "devices/...", saramaTree}},
}

// binaryRules keep what the gateway's binary links small: each was
// megabytes of the ARM binary (see README, "What an ARM build contains").
var binaryRules = []importRule{
	{name: "cmd/edgegate: not the Prometheus client library, nor the protobuf runtime (/metrics is written in exposition.go; the wire format, protowire, aside)", pkgs: "cmd/edgegate",
		deny: []string{"github.com/prometheus/...", "google.golang.org/protobuf/..."},
		allow: []string{"google.golang.org/protobuf/encoding/protowire", "google.golang.org/protobuf/internal/errors",
			"google.golang.org/protobuf/internal/detrand"}},
	{name: "cmd/edgegate: of periph's host drivers only the Linux ones (sysfs for /dev/i2c-N, gpioioctl), not every board's", pkgs: "cmd/edgegate",
		deny:  []string{"periph.io/x/host/v3/..."},
		allow: []string{"periph.io/x/host/v3/sysfs", "periph.io/x/host/v3/gpioioctl", "periph.io/x/host/v3/fs"}},
}

// TestDependencyDirection checks every package of the trees the rules
// name against the rules, over the import graph go list -deps prints.
func TestDependencyDirection(t *testing.T) {
	checkImports(t, nil, nil, importRules, "./aggregate/...", "./bridge/...", "./devices/...", "./firmware-sim/...", "./gateway/...")
}

// TestBinaryDependencies checks what the gateway's binary links.
func TestBinaryDependencies(t *testing.T) {
	checkImports(t, nil, nil, binaryRules, "./cmd/edgegate")
}

// checkImports checks the packages that patterns name against rules, with
// env added to the go command's environment and flags before the patterns.
func checkImports(t *testing.T, env, flags []string, rules []importRule, patterns ...string) {
	t.Helper()
	const mod = "github.com/edgegate/edgegate"
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}\t{{.Standard}}\t{{.DepOnly}}\t{{join .Imports \" \"}}"}, flags...)
	cmd := exec.Command("go", append(args, patterns...)...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	std := map[string]bool{"C": true}
	imports := map[string][]string{}
	var listed []string // the module's packages, as relative paths
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 4 {
			t.Fatalf("go list: unexpected line %q", line)
		}
		std[f[0]] = f[1] == "true"
		imports[f[0]] = strings.Fields(f[3])
		if f[2] == "false" {
			listed = append(listed, strings.TrimPrefix(f[0], mod+"/"))
		}
	}
	// A pattern without a dot in its first element is the module's.
	abs := func(p string) string {
		if first, _, _ := strings.Cut(p, "/"); !strings.Contains(first, ".") {
			return mod + "/" + p
		}
		return p
	}
	match := func(pattern, path string) bool {
		pattern = abs(pattern)
		if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
			return path == tree || strings.HasPrefix(path, tree+"/")
		}
		return path == pattern
	}
	matchAny := func(patterns []string, path string) bool {
		for _, p := range patterns {
			if match(p, path) {
				return true
			}
		}
		return false
	}
	for _, r := range rules {
		applied := false
		for _, pkg := range listed {
			if !match(r.pkgs, abs(pkg)) {
				continue
			}
			applied = true
			// Breadth first over the imports: every dependency of pkg,
			// each with the import that first led to it. What is reached
			// only through a wrong arrow is not reported again.
			from := map[string]string{abs(pkg): ""}
			queue := []string{abs(pkg)}
			for len(queue) > 0 {
				p := queue[0]
				queue = queue[1:]
				for _, dep := range imports[p] {
					if _, seen := from[dep]; seen {
						continue
					}
					from[dep] = p
					var bad bool
					switch {
					case match(r.pkgs, dep) || std[dep]:
					case r.only:
						bad = !matchAny(r.allow, dep)
					default:
						bad = matchAny(r.deny, dep) && !matchAny(r.allow, dep)
					}
					if bad {
						chain := []string{strings.TrimPrefix(dep, mod+"/")}
						for q := from[dep]; q != ""; q = from[q] {
							chain = append([]string{strings.TrimPrefix(q, mod+"/")}, chain...)
						}
						t.Errorf("rule %q: %s depends on %s (%s)", r.name, pkg, strings.TrimPrefix(dep, mod+"/"), strings.Join(chain, " -> "))
						continue
					}
					queue = append(queue, dep)
				}
			}
		}
		if !applied {
			t.Errorf("rule %q: no package matches %s", r.name, r.pkgs)
		}
	}
}

// TestTestOnlyPackages: the power-loss card (FUSE) is for tests; no
// binary links it.
func TestTestOnlyPackages(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		if p := strings.TrimSpace(line); strings.HasPrefix(p, "github.com/hanwen/go-fuse/") || strings.HasSuffix(p, "/firmware-sim/sdcard") {
			t.Errorf("a binary links %s, which only tests may", p)
		}
	}
}
