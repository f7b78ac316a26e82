package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// counter counts what a real mochi broker receives.
type counter struct {
	mqtt.HookBase
	mu       sync.Mutex
	sessions int
	pubs     map[string]int // by client
}

func (c *counter) ID() string { return "counter" }
func (c *counter) Provides(b byte) bool {
	return b == mqtt.OnPublish || b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck || b == mqtt.OnSessionEstablished
}
func (c *counter) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }
func (c *counter) OnACLCheck(*mqtt.Client, string, bool) bool              { return true }
func (c *counter) OnSessionEstablished(*mqtt.Client, packets.Packet) {
	c.mu.Lock()
	c.sessions++
	c.mu.Unlock()
}
func (c *counter) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	c.mu.Lock()
	c.pubs[cl.ID]++
	c.mu.Unlock()
	return pk, nil
}

func (c *counter) counts() (sessions, pubs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.pubs {
		pubs += n
	}
	return c.sessions, pubs
}

func startMochi(t *testing.T) (string, *counter) {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler)})
	c := &counter{pubs: map[string]int{}}
	srv.AddHook(c, nil)
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	if err := srv.AddListener(tcp); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return tcp.Address(), c
}

// TestHoldThenReadings: with --hold every device connects and nothing is
// sent until a line arrives on stdin; --readings then sends exactly that
// many readings, spread evenly over the devices, and the run ends by
// itself well within --duration.
func TestHoldThenReadings(t *testing.T) {
	addr, c := startMochi(t)
	pr, pw := io.Pipe()
	defer pw.Close()
	stdin = pr
	t.Cleanup(func() { stdin = nil })
	var out, errb bytes.Buffer
	status := make(chan int, 1)
	go func() {
		status <- runMain(context.Background(), []string{"run", "--addr", addr, "--devices", "5", "--metrics", "2", "--rate", "50",
			"--qos", "1", "--readings", "100", "--hold", "--duration", "5m"}, &out, &errb)
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if s, _ := c.counts(); s == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the devices never connected")
		}
	}
	time.Sleep(200 * time.Millisecond) // ten sample intervals
	if _, pubs := c.counts(); pubs != 0 {
		t.Fatalf("%d publications before the start line", pubs)
	}
	if _, err := pw.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	if code := <-status; code != 0 {
		t.Fatalf("edgesim run: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if sessions, pubs := c.counts(); sessions != 5 || pubs != 100 {
		t.Errorf("broker saw %d sessions and %d publications, want 5 and 100", sessions, pubs)
	}
	c.mu.Lock()
	for id, n := range c.pubs {
		if n != 20 {
			t.Errorf("%s sent %d, want 20", id, n)
		}
	}
	c.mu.Unlock()
	text := out.String()
	if !strings.Contains(text, "connected 5 devices\n") {
		t.Errorf("no connected line:\n%s", text)
	}
	for row, want := range map[string]float64{"readings sent": 100, "readings acked": 100, "errors": 0, "devices": 5} {
		if got := summaryRow(t, text, row); got != want {
			t.Errorf("%s = %v, want %v", row, got, want)
		}
	}
}

// TestReadingsErrors: counts that cannot be split evenly are refused with
// the two nearest that can.
func TestReadingsErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"not a multiple":      {[]string{"--devices", "5", "--metrics", "2", "--readings", "101"}, "--readings 101: not a multiple of --devices × --metrics (10); use 100 or 110"},
		"fewer than one each": {[]string{"--devices", "5", "--metrics", "2", "--readings", "3"}, "--readings 3: fewer than --devices × --metrics (10); use 10 or a multiple of it"},
		"with a scenario":     {[]string{"--scenario", "x.yaml", "--readings", "10"}, "--readings needs load mode"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := runMain(context.Background(), append([]string{"run", "--addr", "127.0.0.1:1"}, tc.args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errb.String(), tc.want)
			}
		})
	}
}

// summaryRow returns the value of a row of run's summary table.
func summaryRow(t *testing.T, table, row string) float64 {
	t.Helper()
	for line := range strings.Lines(table) {
		if rest, ok := strings.CutPrefix(line, row+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("row %q: %v", row, err)
			}
			return v
		}
	}
	t.Fatalf("no row %q in:\n%s", row, table)
	return 0
}
