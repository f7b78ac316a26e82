package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway/clock"
)

// senmlPack is a SenML pack without times (so the gateway stamps it) of
// n records, record i naming metric(i).
func senmlPack(n int, metric func(i int) string) string {
	recs := make([]string, n)
	for i := range recs {
		recs[i] = fmt.Sprintf(`{"n":%q,"v":%d}`, metric(i), i)
	}
	return "[" + strings.Join(recs, ",") + "]"
}

// TestHoldShare: while the clock is not synchronized, one device floods
// the hold, with thousands of distinct metrics or thousands of readings.
// Held readings obey the aggregator's series limits as they are held
// (those over them are refused as too_many_series), and a device holds at
// most an eighth of clock.hold_max_bytes (beyond it its readings are
// aggregated at once, unverified): the flood does not fill the hold, so
// another device's held reading is still re-based when the clock
// synchronizes, not released unverified with everyone's. Across a
// restart too: what each device holds is rebuilt from the hold log.
func TestHoldShare(t *testing.T) {
	for name, tc := range map[string]struct {
		packs   int
		metric  func(i int) string
		rebased uint64 // the good device's 1 and the flood's held readings
		share   bool   // a pack of 2,000 readings, not 1,000
		// Counted since the restart (the last two packs): refused as
		// too_many_series, aggregated at once over the device's share.
		refused, overShare uint64
	}{
		// 4 × 1,000 distinct metrics: 256 are held
		// (aggregate.max_metrics_per_device), the rest refused.
		"distinct metrics": {4, func(i int) string { return fmt.Sprintf("m%04d", i) }, 1 + 256, false, 2000, 0},
		// 4 × 2,000 readings of one metric: 8 KiB of them are held.
		"bytes": {4, func(int) string { return "x" }, 0, true, 0, 4000},
	} {
		t.Run(name, func(t *testing.T) {
			stale := t0.Add(-72 * time.Hour)
			clk := clock.NewManual(stale, false)
			r := manualStack(t, clk, func(c *configs.Config) { c.Clock.HoldMaxBytes = 64 << 10 })
			r.publish("dev-g", "sensors/dev-g/t", "1") // taken at t0 by true time
			for p := range tc.packs {
				if p == tc.packs/2 {
					r.restart()
				}
				n := 1000
				if tc.share {
					n = 2000
				}
				r.publish("dev-h", "sensors/dev-h", senmlPack(n, func(i int) string { return tc.metric(p*n + i) }))
			}
			held := r.gw.Stats().Hold
			if held.Unverified != 0 || held.Bytes >= 64<<10 || held.Refused != tc.refused || held.OverShare != tc.overShare {
				t.Fatalf("hold %+v: want the flood held within its limits (%d refused, %d over its share), the hold (64 KiB) not released", held, tc.refused, tc.overShare)
			}
			r.synchronize(clk, t0.Add(time.Second))
			st := r.gw.Stats()
			if st.Hold.Unverified != 0 || st.Hold.Rebased < 2 || tc.rebased != 0 && st.Hold.Rebased != tc.rebased {
				t.Errorf("hold %+v: want none unverified, the good device's reading re-based (%d in all)", st.Hold, tc.rebased)
			}
			r.stop()
		})
	}
}
