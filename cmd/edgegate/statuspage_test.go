//go:build e2e

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
)

// TestStatusPage loads the status page from a running gateway in headless
// Chromium (Debian's chromium), waits until its devices table lists the
// three devices that published and its dead-letter table the bad payload,
// and saves a PNG screenshot (its path is in the log).
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

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath("chromium"), chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
		chromedp.WindowSize(1200, 800))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 60*time.Second)
	defer tcancel()
	err := chromedp.Do(bctx,
		chromedp.Navigate("http://"+p.http.Addr().String()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#devices tbody tr:nth-child(3)`)),
		chromedp.WaitVisible(chromedp.CSS(`#dead tbody tr`)),
		chromedp.Sleep(2500*time.Millisecond), // a second refresh fills in readings/min
	)
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	devices, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#devices tbody`)))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#dead tbody`)))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
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
	path := filepath.Join(os.TempDir(), fmt.Sprintf("edgegate-status-page-%d.png", time.Now().Unix()))
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("status page screenshot: %s (%d bytes)", path, len(shot))
}
