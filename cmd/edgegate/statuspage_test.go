//go:build e2e

package main

import (
	"context"
	"fmt"
	"html"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// TestStatusPage loads the status page from a running gateway in headless
// Chromium (Debian's chromium), waits until its devices table lists the
// three devices that published and its dead-letter table the bad payload,
// and saves a PNG screenshot (its path is in the log). Chromium is run as
// a command (--dump-dom, --screenshot): the checks read the page after its
// script has run and need no interaction with it.
func TestStatusPage(t *testing.T) {
	need(t, "chromium")
	ctx, p := runPipeline(t, "page-gw")
	for i, dev := range []string{"page-dev-1", "page-dev-2", "page-dev-3"} {
		conn, err := net.Dial("tcp", p.gw.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: dev})
		if _, err := c.Connect(ctx, &paho.Connect{ClientID: dev, KeepAlive: 30, CleanStart: true}); err != nil {
			t.Fatal(err)
		}
		defer c.Disconnect(&paho.Disconnect{})
		for j := range 5 {
			c.Publish(ctx, &paho.Publish{Topic: "sensors/" + dev + "/temp", QoS: 1, Payload: []byte(fmt.Sprint(20 + i + j))})
		}
		if i == 2 {
			c.Publish(ctx, &paho.Publish{Topic: "sensors/" + dev + "/temp", QoS: 1, Payload: []byte("scorching")})
		}
	}

	url := "http://" + p.http.Addr().String() + "/"
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// 4.5 s of the page's own time: the first poll fills the tables, a
	// second refresh (every 2 s) fills in readings/min.
	const budget = "--virtual-time-budget=4500"
	var devices, dead, lastDOM string
	for {
		dom, err := chromium(ctx, t, budget, "--dump-dom", url)
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		devices, dead, lastDOM = tbodyText(dom, "devices"), tbodyText(dom, "dead"), dom
		if strings.Count(devices, "\n") >= 3 && strings.Count(dead, "\n") >= 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("chromium: the tables did not fill in: devices %q, dead letters %q", devices, dead)
		case <-time.After(500 * time.Millisecond):
		}
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("edgegate-status-page-%d.png", time.Now().Unix()))
	if _, err := chromium(ctx, t, budget, "--screenshot="+path, url); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	shot, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"page-dev-1", "page-dev-2", "page-dev-3"} {
		if !strings.Contains(devices, dev) {
			t.Errorf("devices table lacks %s:\n%s", dev, devices)
		}
	}
	if !strings.Contains(dead, "not_a_number") || !strings.Contains(dead, "page-dev-3") {
		t.Errorf("dead letters table: %q", dead)
	}
	// The gateway's clock card (runPipeline says it is synchronized).
	if m := clockCard.FindStringSubmatch(lastDOM); m == nil || m[1] != "synchronized" || !strings.Contains(m[2], "assumed") {
		t.Errorf("clock card: %q", m)
	}
	t.Logf("status page screenshot: %s (%d bytes)", path, len(shot))
}

// chromium runs headless Chromium, in a profile of its own, with flags
// and url, and returns its standard output.
func chromium(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--window-size=1200,800", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, "chromium", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%v\n%s", err, stderr.String())
	}
	return string(out), nil
}

var tag = regexp.MustCompile(`<[^>]*>`)

// clockCard finds the clock card's state and details in the page.
var clockCard = regexp.MustCompile(`<b id="clock"[^>]*>([^<]*)</b><span id="clockinfo">([^<]*)</span>`)

// tbodyText is the text of the body of the table with the given id in
// dom, one line per row and a tab after each cell.
func tbodyText(dom, id string) string {
	_, table, ok := strings.Cut(dom, `<table id="`+id+`">`)
	if !ok {
		return ""
	}
	table, _, _ = strings.Cut(table, "</table>")
	_, body, _ := strings.Cut(table, "<tbody>")
	body, _, _ = strings.Cut(body, "</tbody>")
	body = strings.NewReplacer("</td>", "\t", "</tr>", "\n").Replace(body)
	return html.UnescapeString(tag.ReplaceAllString(body, ""))
}
