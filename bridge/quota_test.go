package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge"
	wire "github.com/edgegate/edgegate/bridge/summary"
)

func bigDeadLetter(i int) wire.DeadLetter {
	return wire.DeadLetter{Reason: "not_a_number", Device: "bad", ReceivedAt: time.Unix(int64(i), 0),
		Payload: []byte(strings.Repeat("x", 4<<10)), PayloadBytes: 60 << 10}
}

// TestDeadLettersHaveTheirShare fills the queue (Kafka down) with dead
// letters of one hostile device, then queues summaries: dead letters
// beyond their share of the quota (10%) are counted and dropped, never
// displacing anything, and every summary goes in.
func TestDeadLettersHaveTheirShare(t *testing.T) {
	for _, policy := range []bridge.FullPolicy{bridge.Backpressure, bridge.DropOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			const quota = 1 << 20
			f := newForwarder(t, bridge.Options{Dir: t.TempDir(), MaxBytes: quota, Policy: policy}, []string{"127.0.0.1:9"})
			f.DeadLetter(bigDeadLetter(0), bridge.Mark{})
			per := f.Stats().QueueBytes // one dead letter on disk
			fit := int(quota / 10 / per)
			const letters, sums = 300, 1500 // 1.3 MiB of dead letters; 0.6 MiB of summaries
			for i := 1; i < letters; i++ {
				f.DeadLetter(bigDeadLetter(i), bridge.Mark{})
			}
			for m := range sums {
				f.Summary(summary("d", m), bridge.Mark{})
			}
			st := f.Stats()
			if st.Dropped != 0 || st.Queued != uint64(fit+sums) {
				t.Errorf("queue dropped %d and holds %d records, want 0 and %d (%d dead letters that fit in 10%%, %d summaries)",
					st.Dropped, st.Queued, fit+sums, fit, sums)
			}
			// The share is filled to within one dead letter (segment
			// headers make the bytes on disk vary a little).
			if st.DeadLettersDropped != uint64(letters-fit) || st.DeadLetterBytes > quota/10 || st.DeadLetterBytes <= quota/10-per || st.Full {
				t.Errorf("dead letters dropped %d, %d bytes of them queued, full %v; want %d, within %d bytes under %d, false",
					st.DeadLettersDropped, st.DeadLetterBytes, st.Full, letters-fit, per, quota/10)
			}
		})
	}
}

// TestBackpressureNeverDropsSummaries queues three times the quota of
// summaries with Kafka down: under backpressure the queue reports full
// from its mark on, and not one summary is dropped (the ones beyond the
// quota are counted); the queue holds all of them.
func TestBackpressureNeverDropsSummaries(t *testing.T) {
	const quota = 1 << 20
	f := newForwarder(t, bridge.Options{Dir: t.TempDir(), MaxBytes: quota}, []string{"127.0.0.1:9"})
	n, fullAt := 0, 0
	for f.Stats().QueueBytes < 3*quota && n < 20_000 { // 3 MiB is about 8,000 summaries
		f.Summary(summary("d", n), bridge.Mark{})
		n++
		if fullAt == 0 && f.Full() {
			fullAt = n
		}
	}
	st := f.Stats()
	if st.Dropped != 0 || st.Queued != uint64(n) {
		t.Errorf("queue dropped %d and holds %d records, want 0 and %d", st.Dropped, st.Queued, n)
	}
	if !st.Full || fullAt == 0 || fullAt > n/3 {
		t.Errorf("full %v, first at record %d of %d; want full before the quota", st.Full, fullAt, n)
	}
	if st.OverQuota == 0 || st.OverQuota >= uint64(n) {
		t.Errorf("%d records over the quota, want some of %d", st.OverQuota, n)
	}
}
