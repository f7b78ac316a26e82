package journal

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/queue"
)

// TestAttackJournalPendingOvershoot: TestJournalBoundsPending with the
// publications coming from many clients at once, as they do (each
// connection's goroutine publishes). beginPublish checks the bound,
// unlocks, and begin locks again: every publisher woken by the same
// Broadcast sees the bound free and appends, so what waits for the card
// exceeds MaxPending by one publication per waiting client (10,000
// clients of 256 KiB: 2.5 GB over an 8 MiB bound), not by one.
func TestAttackJournalPendingOvershoot(t *testing.T) {
	const size, clients, each, bound = 200 << 10, 40, 5, 2 << 20
	payload := make([]byte, size)
	l, err := queue.Open(t.TempDir(), queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	j := New(l, Options{Interval: 300 * time.Millisecond, MaxPending: bound, Apply: func(uint64, [][]byte) {}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- j.Run(ctx) }()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				if _, _, err := j.Publish("flood", "", nil, 0, 0, "sensors/flood/t", payload, false); err != nil {
					t.Errorf("client %d publication %d: %v", c, i, err)
					return
				}
			}
		})
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	most := 0
loop:
	for {
		most = max(most, j.Pending())
		select {
		case <-published:
			break loop
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if most >= bound+size+100 {
		t.Errorf("bounded at %d bytes: %d waited at once (%.1f publications over)", bound, most, float64(most-bound)/size)
	}
}
