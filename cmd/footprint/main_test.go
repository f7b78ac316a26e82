package main

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestMain lets the test binary be the plain mochi broker too: the bench
// starts its own executable with "mochi" for it.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "mochi" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestBenchOnTinyLoads builds edgegate, edgesim and devkafka and runs the
// whole bench, two rounds of tiny loads, against mochi, edgegate and (when
// installed) mosquitto: every CPU run counts exactly the readings asked
// for, every edgegate run delivers the windows of its readings to Kafka,
// and the table has a column per broker and a row per figure.
func TestBenchOnTinyLoads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three commands and runs 18 brokers")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../edgegate", "../edgesim", "../devkafka")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	brokers := []string{"mochi", "edgegate"}
	if _, err := exec.LookPath("mosquitto"); err == nil {
		brokers = append([]string{"mosquitto"}, brokers...)
	} else {
		t.Log("mosquitto not installed (apt-get install -y mosquitto): comparing mochi and edgegate only")
	}
	// A relative -dir, as make bench-footprint gives.
	cwd, _ := os.Getwd()
	work, err := filepath.Rel(cwd, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	code := runMain(context.Background(), []string{"-bin", bin, "-dir", work, "-brokers", strings.Join(brokers, ","), "-rounds", "2",
		"-cpu-devices", "4", "-cpu-metrics", "2", "-cpu-rate", "20", "-cpu-readings", "80",
		"-devices", "20", "-metrics", "2", "-memory-rate", "5", "-memory-duration", "1s",
		"-latency-rate", "10", "-latency-duration", "1s", "-idle-settle", "100ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	progress, table := errb.String(), out.String()
	for _, b := range brokers {
		if n := strings.Count(progress, "cpu     "+pad(b)+" "); n != 2 {
			t.Errorf("%s: %d CPU runs, want 2:\n%s", b, n, progress)
		}
		re := regexp.MustCompile(`cpu     ` + pad(b) + ` +[0-9.]+ µs per reading \(([0-9,]+) readings acknowledged`)
		for _, m := range re.FindAllStringSubmatch(progress, -1) {
			if m[1] != "80" {
				t.Errorf("%s: a CPU run counted %s readings, want 80", b, m[1])
			}
		}
	}
	// 4 devices × 2 metrics are 8 series: 8 windows, or up to 16 when the
	// run crosses a minute; 20 × 2 series in the memory run.
	for _, c := range []struct {
		what     string
		min, max int
	}{{"per CPU run", 8, 16}, {"per memory run", 40, 80}} {
		m := regexp.MustCompile(c.what + ` \[(\d+) (\d+)\]`).FindStringSubmatch(table)
		if m == nil {
			t.Errorf("no summaries %s in:\n%s", c.what, table)
			continue
		}
		for _, s := range m[1:] {
			if n, _ := strconv.Atoi(s); n < c.min || n > c.max {
				t.Errorf("%d summaries %s, want %d to %d", n, c.what, c.min, c.max)
			}
		}
	}
	header := strings.SplitN(table, "\n| |", 2)
	if len(header) != 2 || strings.Count(strings.SplitN(header[1], "\n", 2)[0], "|") != len(brokers) {
		t.Errorf("table header does not have %d brokers:\n%s", len(brokers), table)
	}
	for _, r := range []string{"| CPU per reading, 4 devices × 2 metrics × 20/s, 80 readings |", "| peak RSS, 20 devices × 2 metrics × 5/s, 1s |",
		"| idle RSS, 20 devices connected |", "| PUBACK p99, 200 readings/s offered |", "| PUBACK p99, 400 readings/s offered |"} {
		if !strings.Contains(table, r) {
			t.Errorf("no row %q in:\n%s", r, table)
		}
	}
	// Peak RSS is a high-water mark: never below the idle RSS before it.
	re := regexp.MustCompile(`memory  (\S+) +idle +([0-9.]+) MiB  peak +([0-9.]+) MiB`)
	for _, m := range re.FindAllStringSubmatch(progress, -1) {
		idle, _ := strconv.ParseFloat(m[2], 64)
		peak, _ := strconv.ParseFloat(m[3], 64)
		if idle <= 0 || peak < idle {
			t.Errorf("%s: idle %v MiB, peak %v MiB", m[1], idle, peak)
		}
	}
}

func pad(s string) string { return s + strings.Repeat(" ", max(0, 9-len(s))) }
