package summary

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/edgegate/edgegate/aggregate"
)

// SchemaVersion is the version of the summary record's JSON schema, which
// the gateway writes in the HeaderSchema header and Decode reads up to. It
// changes only when a field changes meaning or goes away (adding a field
// does not change it).
const SchemaVersion = 1

// Header names, on every record the gateway produces (summaries and dead
// letters).
const (
	HeaderGateway     = "edgegate-gateway"        // the gateway's id (gateway.id)
	HeaderSchema      = "edgegate-schema-version" // SchemaVersion or DeadLetterSchemaVersion, in decimal
	HeaderContentType = "content-type"            // ContentType
)

// ContentType is the value of the HeaderContentType header: every record
// value is one JSON object.
const ContentType = "application/json"

// ID returns the deterministic id of one revision of one window: the first
// 128 bits of SHA-256 over gateway, device, metric, window start and
// revision, in hex. The same inputs always give the same id, so consumers
// can deduplicate by it; Validate checks it. The aggregator stamps every
// summary with it (aggregate.SummaryID, which this calls).
func ID(gateway, device, metric string, windowStart time.Time, revision int) string {
	return aggregate.SummaryID(gateway, device, metric, windowStart, revision)
}

// RecordKey returns the Kafka record key of a summary: "<gateway>/<device>",
// so that every device's summaries land on one partition, in order.
func RecordKey(s *Summary) []byte {
	return []byte(s.Gateway + "/" + s.Device)
}

// AppendJSON appends s as one JSON object, fields in schema order (see
// summary.schema.json). It produces the same text as encoding/json for the
// same struct, without reflection. Non-finite numbers (which validated
// input cannot produce) are written as null to keep the output valid JSON.
func AppendJSON(b []byte, s *Summary) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, s.ID)
	b = append(b, `,"gateway":`...)
	b = appendString(b, s.Gateway)
	b = append(b, `,"device":`...)
	b = appendString(b, s.Device)
	b = append(b, `,"metric":`...)
	b = appendString(b, s.Metric)
	b = append(b, `,"unit":`...)
	b = appendString(b, s.Unit)
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
		b = appendFloat(b, f.v)
	}
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, int64(s.Revision), 10)
	b = append(b, `,"late":`...)
	b = strconv.AppendInt(b, s.Late, 10)
	b = append(b, `,"time_source":`...)
	b = appendString(b, s.TimeSource)
	b = append(b, `,"time_replaced":`...)
	b = strconv.AppendInt(b, s.TimeReplaced, 10)
	b = append(b, `,"time_rebased":`...)
	b = strconv.AppendInt(b, s.TimeRebased, 10)
	b = append(b, `,"time_unverified":`...)
	b = strconv.AppendInt(b, s.TimeUnverified, 10)
	return append(b, '}')
}

// appendFloat formats f the way encoding/json does: shortest representation,
// plain notation for 1e-6 <= |f| < 1e21, exponent notation otherwise.
func appendFloat(b []byte, f float64) []byte {
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

// appendString appends s as a JSON string, escaping as encoding/json does
// (including <, > and & and the line separators U+2028 and U+2029).
func appendString(b []byte, s string) []byte {
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
