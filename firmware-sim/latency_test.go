package firmwaresim

import (
	"testing"
	"time"
)

func TestAckLatencyQuantiles(t *testing.T) {
	var f Fleet
	if f.AckLatency(0.5) != 0 {
		t.Error("latency before any acknowledgement")
	}
	for i := range 100 { // 0.05 ms, 1.05 ms, … 99.05 ms
		f.recordAck(time.Duration(i)*time.Millisecond + 50*time.Microsecond)
	}
	f.recordAck(time.Second) // beyond the last bucket
	if p50, p99 := f.AckLatency(0.5), f.AckLatency(0.99); p50 != 50100*time.Microsecond || p99 != 99100*time.Microsecond {
		t.Errorf("p50 %v p99 %v, want 50.1ms 99.1ms", p50, p99)
	}
	if f.AckLatency(0.999) != 100*time.Millisecond {
		t.Errorf("p99.9 %v, want the overflow bucket, 100ms", f.AckLatency(0.999))
	}
}
