package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfigReportsEveryProblem: edgegate check on a config with three
// mistakes (the sample config with mqtt.listen misspelt, the window in
// words and no broker) names all three, each with its line, in one run.
func TestCheckConfigReportsEveryProblem(t *testing.T) {
	sample, err := os.ReadFile("../../configs/edgegate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(sample)
	for _, r := range [][2]string{
		{"\n  listen: 0.0.0.0:1883\n", "\n  listn: 0.0.0.0:1883\n"},
		{"\n  window: 1m\n", "\n  window: 1 minute\n"},
		{"\n  brokers: [127.0.0.1:9092]\n", "\n  brokers: []\n"},
	} {
		if strings.Count(text, r[0]) != 1 {
			t.Fatalf("the sample config has %q %d times, want once", r[0], strings.Count(text, r[0]))
		}
		text = strings.Replace(text, r[0], r[1], 1)
	}
	path := filepath.Join(t.TempDir(), "edgegate.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	lineOf := func(s string) int {
		return strings.Count(text[:strings.Index(text, s)], "\n") + 1
	}

	code, out, errs := run(t, "check", "--config", path)
	if code != 1 || out != "" {
		t.Errorf("code %d, stdout %q; want 1 and nothing", code, out)
	}
	want := []string{
		"edgegate: config " + path + ": 3 problems:\n",
		fmt.Sprintf("  line %d: mqtt.listn: unknown key; did you mean mqtt.listen?\n", lineOf("listn:")),
		fmt.Sprintf("  line %d: aggregate.window: \"1 minute\" is not a duration; write it as 1m, 90s or 1h30m\n", lineOf("window: 1 minute")),
		fmt.Sprintf("  line %d: kafka.brokers: is empty; list at least one ", lineOf("brokers: []")),
	}
	for _, w := range want {
		if !strings.Contains(errs, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errs)
		}
	}
	if n := strings.Count(errs, "\n"); n != 4 {
		t.Errorf("stderr has %d lines, want the heading and 3 problems:\n%s", n, errs)
	}
}
