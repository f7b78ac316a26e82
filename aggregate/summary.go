package aggregate

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// SchemaVersion is the version of the summary record's JSON schema. It is
// carried in a Kafka header; it changes only when a field changes meaning or
// goes away (adding a field does not change it).
const SchemaVersion = 1

// Summary is the statistics of one metric of one device over one window, as
// published to Kafka (SPEC.md, "Summary record value"). A window may be
// emitted several times: revision 0 first, then one revision per late
// reading; each revision covers every reading of the window so far, so the
// highest revision is the whole truth.
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
}

// SummaryID returns the deterministic id of one revision of one window: the
// first 128 bits of SHA-256 over the identifying fields, in hex. The same
// inputs always give the same id, so consumers can deduplicate by it.
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

// Key returns the Kafka record key for the summary: gateway and device, so
// that every device's summaries land on one partition, in order.
func (s *Summary) Key() []byte {
	return []byte(s.Gateway + "/" + s.Device)
}

// AppendJSON appends the summary as one JSON object, fields in schema order.
// It produces the same text as encoding/json for the same struct, without
// reflection. Non-finite numbers (which validated input cannot produce) are
// written as null to keep the output valid JSON.
func (s *Summary) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = AppendJSONString(b, s.ID)
	b = append(b, `,"gateway":`...)
	b = AppendJSONString(b, s.Gateway)
	b = append(b, `,"device":`...)
	b = AppendJSONString(b, s.Device)
	b = append(b, `,"metric":`...)
	b = AppendJSONString(b, s.Metric)
	b = append(b, `,"unit":`...)
	b = AppendJSONString(b, s.Unit)
	b = append(b, `,"window_start":"`...)
	b = s.WindowStart.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","window_end":"`...)
	b = s.WindowEnd.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","count":`...)
	b = strconv.AppendInt(b, s.Count, 10)
	for _, f := range [...]struct {
		name string
		v    float64
	}{
		{`,"min":`, s.Min}, {`,"max":`, s.Max}, {`,"sum":`, s.Sum}, {`,"mean":`, s.Mean},
		{`,"first":`, s.First}, {`,"last":`, s.Last}, {`,"stddev":`, s.Stddev},
	} {
		b = append(b, f.name...)
		b = AppendFloat(b, f.v)
	}
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, int64(s.Revision), 10)
	b = append(b, `,"late":`...)
	b = strconv.AppendInt(b, s.Late, 10)
	return append(b, '}')
}

// AppendFloat formats f the way encoding/json does: shortest representation,
// plain notation for 1e-6 <= |f| < 1e21, exponent notation otherwise.
func AppendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9, as encoding/json does
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string, escaping as encoding/json does
// (including <, > and & and the line separators U+2028 and U+2029).
func AppendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
