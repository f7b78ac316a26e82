package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime ...; the name may hold ") (".
	line := "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 37 0 0 20 0 9 0 12345 1000000 300 18446744073709551615\n"
	got, err := parseStat(line)
	if err != nil || got != 2870*time.Millisecond {
		t.Errorf("parseStat = %v, %v; want 2.87s", got, err)
	}
	if _, err := parseStat("4242 (short) S 1 2"); err == nil {
		t.Error("a short line parsed")
	}
	// This process's own line parses, and its CPU only grows.
	a, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for x := 0; x < 1e7; x++ {
	}
	if b, err := cpuTime(os.Getpid()); err != nil || b < a {
		t.Errorf("cpu %v then %v (%v)", a, b, err)
	}
}

func TestParseStatus(t *testing.T) {
	s := "Name:\tx\nVmPeak:\t  900 kB\nVmHWM:\t    3000 kB\nVmRSS:\t    2048 kB\nThreads:\t9\n"
	rss, hwm, err := parseStatus(s)
	if err != nil || rss != 2048*1024 || hwm != 3000*1024 {
		t.Errorf("parseStatus = %d, %d, %v", rss, hwm, err)
	}
	if _, _, err := parseStatus("Name:\tx\nVmRSS:\t 1 kB\n"); err == nil {
		t.Error("status without VmHWM parsed")
	}
	if rss, hwm, err := memory(os.Getpid()); err != nil || rss == 0 || hwm < rss {
		t.Errorf("own memory: rss %d hwm %d (%v)", rss, hwm, err)
	}
}

func TestParseTable(t *testing.T) {
	out := `connected 20 devices
t=  1s sent     1000 (  1000/s) acked     1000 (  1000/s) errors 0 reconnects 0 buffered 0

                              total
seconds                         1.0
devices                          20
readings sent                  1000
readings sent/s                 998
readings acked                 1000
PUBACK p50 ms                   0.3
PUBACK p99 ms                  12.5
errors                            2
connections                      20
`
	r, err := parseTable(out)
	want := loadResult{sent: 1000, acked: 1000, errors: 2, rate: 998, p50: 0.3, p99: 12.5}
	if err != nil || r != want {
		t.Errorf("parseTable = %+v, %v; want %+v", r, err, want)
	}
	if _, err := parseTable(strings.Replace(out, "PUBACK p99 ms", "x", 1)); err == nil || !strings.Contains(err.Error(), `no row "PUBACK p99 ms"`) {
		t.Errorf("missing row: %v", err)
	}
}
