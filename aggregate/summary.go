package aggregate

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// Summary is the statistics of one metric of one device over one window
// (SPEC.md, "Summary record value"). A window may be emitted several times:
// revision 0 first, then one revision per late reading; each revision
// covers every reading of the window so far, so the highest revision is the
// whole truth. Package bridge/summary encodes it for Kafka (and decodes it
// for consumers); the JSON tags name its fields there.
type Summary struct {
	ID          string    `json:"id"`
	Gateway     string    `json:"gateway"`
	Device      string    `json:"device"`
	Metric      string    `json:"metric"`
	Unit        string    `json:"unit"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	Count       int64     `json:"count"`
	Min         float64   `json:"min"`
	Max         float64   `json:"max"`
	Sum         float64   `json:"sum"`
	Mean        float64   `json:"mean"`
	First       float64   `json:"first"`  // value with the earliest event time
	Last        float64   `json:"last"`   // value with the latest event time
	Stddev      float64   `json:"stddev"` // population standard deviation
	Revision    int       `json:"revision"`
	Late        int64     `json:"late"` // late readings folded in
	// Where the readings' times came from: SourceDevice (every one from
	// its device's clock), SourceGateway (every one stamped by the gateway
	// on arrival) or SourceMixed. Empty in summaries of gateways before
	// these fields.
	TimeSource string `json:"time_source"`
	// Of the readings stamped by the gateway: TimeReplaced ones whose
	// device gave a time before any real reading can be (a clock never
	// set), stamped on arrival instead; TimeRebased ones taken while the
	// gateway's clock was not synchronized and re-based to true time once
	// it was; TimeUnverified ones taken while it was not synchronized and
	// never checked, since it did not synchronize in time.
	TimeReplaced   int64 `json:"time_replaced"`
	TimeRebased    int64 `json:"time_rebased"`
	TimeUnverified int64 `json:"time_unverified"`
}

// SummaryID returns the deterministic id of one revision of one window: the
// first 128 bits of SHA-256 over the identifying fields, in hex. The same
// inputs always give the same id, so consumers can deduplicate by it. The
// aggregator stamps each summary with it; consumers call it as
// bridge/summary.ID, which documents it as part of the wire contract.
func SummaryID(gateway, device, metric string, windowStart time.Time, revision int) string {
	h := sha256.New()
	var buf [64]byte
	b := buf[:0]
	for _, s := range [...]string{gateway, device, metric} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	b = strconv.AppendInt(b, windowStart.UnixNano(), 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(revision), 10)
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}
