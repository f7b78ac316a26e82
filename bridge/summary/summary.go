// Package summary is the wire contract of the records edgegate writes to
// Kafka, in one place: the gateway encodes with it and the programs that
// consume the records decode with it.
//
// A summary record (value: the JSON object of AppendJSON, described for
// other languages by summary.schema.json in this directory, JSON Schema
// 2020-12) carries three headers: edgegate-gateway, edgegate-schema-version
// (SchemaVersion) and content-type (application/json). Its key is
// "<gateway>/<device>" (RecordKey), so a device's summaries are on one
// partition, in window order; a late reading adds a revision of its window,
// which covers every reading of the window so far. Each revision has a
// deterministic id (ID) to deduplicate by.
//
// Its time fields say where the readings' times came from and how far to
// trust them: time_source is "device" (every reading's time from its
// device's clock), "gateway" (every one stamped by the gateway on arrival:
// payloads without a time, the gateway's own sensors) or "mixed"; of the
// gateway's stamps, time_replaced counts readings whose device clock was
// never set (a time before any real reading can be, replaced by the
// arrival), time_rebased readings taken while the gateway's own clock was
// not synchronized and re-based to true time by the monotonic clock once
// it was, and time_unverified readings taken while it was not
// synchronized and shipped unchecked because it did not synchronize in
// time. They were added within schema version 1: records of older
// gateways lack them (Decode leaves TimeSource empty: unknown).
//
// For consumers, Decode checks a record's headers and decodes its value,
// Validate checks a summary's consistency, and Merged keeps the highest
// revision of each window. Dead-letter records (DeadLetter) are encoded
// here too.
//
// The package imports only the standard library and package aggregate
// (for the Summary struct), so that consumers stay lean.
package summary

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

// Summary is the record value; see aggregate.Summary for its fields, and
// AppendJSON for its encoding.
type Summary = aggregate.Summary

// Header is a Kafka record header.
type Header struct{ Key, Value []byte }

// Decode decodes a record's value, checking its headers when present: the
// content type must be JSON, the schema version one this package knows,
// and the gateway header must match the value. Unknown JSON fields are
// allowed (the schema may add fields); missing ones are not.
func Decode(value []byte, headers []Header) (Summary, error) {
	var s Summary
	for _, h := range headers {
		switch string(h.Key) {
		case HeaderContentType:
			if ct := string(h.Value); ct != ContentType {
				return s, fmt.Errorf("content type %q: only application/json is decoded", ct)
			}
		case HeaderSchema:
			v, err := strconv.Atoi(string(h.Value))
			if err != nil || v < 1 {
				return s, fmt.Errorf("schema version %q is not a version", h.Value)
			}
			if v > SchemaVersion {
				return s, fmt.Errorf("schema version %d is newer than this consumer's %d; upgrade it", v, SchemaVersion)
			}
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(value, &fields); err != nil {
		return s, fmt.Errorf("not a JSON object: %w", err)
	}
	var missing []string
	for _, name := range requiredFields {
		if _, ok := fields[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return s, fmt.Errorf("missing fields: %s", strings.Join(missing, ", "))
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("decode summary: %w", err)
	}
	for _, h := range headers {
		if string(h.Key) == HeaderGateway && string(h.Value) != s.Gateway {
			return s, fmt.Errorf("gateway header %q differs from the value's gateway %q", h.Value, s.Gateway)
		}
	}
	return s, nil
}

var requiredFields = []string{"id", "gateway", "device", "metric", "unit", "window_start", "window_end", "count",
	"min", "max", "sum", "mean", "first", "last", "stddev", "revision", "late"}

// Validate checks a summary's internal consistency: identity fields set,
// a positive window, count at least 1, min ≤ first, last, mean ≤ max,
// stddev ≥ 0, 0 ≤ late ≤ count, revision ≥ 0, a known time_source (or
// none) and time counts within count (none with time_source device), and
// the id that the other fields determine. It returns every problem found.
func Validate(s Summary) error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	for name, v := range map[string]string{"gateway": s.Gateway, "device": s.Device, "metric": s.Metric} {
		if v == "" {
			add("%s is empty", name)
		}
	}
	if !s.WindowEnd.After(s.WindowStart) {
		add("window_end %s is not after window_start %s", s.WindowEnd.Format(time.RFC3339Nano), s.WindowStart.Format(time.RFC3339Nano))
	}
	if s.Count < 1 {
		add("count %d: a summary covers at least one reading", s.Count)
	}
	for name, v := range map[string]float64{"min": s.Min, "max": s.Max, "sum": s.Sum, "mean": s.Mean, "first": s.First, "last": s.Last, "stddev": s.Stddev} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			add("%s is not a finite number", name)
		}
	}
	for name, v := range map[string]float64{"first": s.First, "last": s.Last, "mean": s.Mean} {
		// The mean is computed; allow it a rounding error.
		slack := 0.0
		if name == "mean" {
			slack = 1e-9 * max(1, math.Abs(v))
		}
		if v < s.Min-slack || v > s.Max+slack {
			add("%s %v is outside [min %v, max %v]", name, v, s.Min, s.Max)
		}
	}
	if s.Stddev < 0 {
		add("stddev %v is negative", s.Stddev)
	}
	if s.Revision < 0 {
		add("revision %d is negative", s.Revision)
	}
	if s.Late < 0 || s.Late > s.Count {
		add("late %d is outside [0, count %d]", s.Late, s.Count)
	}
	switch s.TimeSource {
	case "", aggregate.SourceDevice, aggregate.SourceGateway, aggregate.SourceMixed:
	default:
		add("time_source %q is not device, gateway or mixed", s.TimeSource)
	}
	if s.TimeReplaced < 0 || s.TimeRebased < 0 || s.TimeUnverified < 0 || s.TimeReplaced+s.TimeRebased+s.TimeUnverified > s.Count {
		add("time_replaced %d, time_rebased %d and time_unverified %d are not counts of at most count %d in all", s.TimeReplaced, s.TimeRebased, s.TimeUnverified, s.Count)
	}
	if s.TimeSource == aggregate.SourceDevice && s.TimeReplaced+s.TimeRebased+s.TimeUnverified > 0 {
		add("time_source is device but some readings were stamped by the gateway")
	}
	if want := ID(s.Gateway, s.Device, s.Metric, s.WindowStart, s.Revision); s.ID != want {
		add("id %q is not the id of this gateway, device, metric, window and revision (%s)", s.ID, want)
	}
	if len(p) > 0 {
		return errors.New(strings.Join(p, "; "))
	}
	return nil
}

// Key identifies a window: the primary key of a table of summaries.
type Key struct {
	Gateway, Device, Metric string
	WindowStart             time.Time
}

// KeyOf returns s's window key.
func KeyOf(s Summary) Key {
	return Key{s.Gateway, s.Device, s.Metric, s.WindowStart.UTC()}
}

// Merged holds the highest revision of each window seen. The zero value
// is ready to use.
type Merged struct {
	m map[Key]Summary
}

// Outcome is what Add did with a summary.
type Outcome int

const (
	New      Outcome = iota // first summary of its window
	Replaced                // a higher revision replaced the one held
	Stale                   // a lower revision than the one held: ignored
	Same                    // the revision held again (a duplicate): ignored
)

// Add merges s: a higher revision replaces a lower one, never the reverse.
func (m *Merged) Add(s Summary) Outcome {
	if m.m == nil {
		m.m = map[Key]Summary{}
	}
	k := KeyOf(s)
	cur, ok := m.m[k]
	switch {
	case !ok:
		m.m[k] = s
		return New
	case s.Revision > cur.Revision:
		m.m[k] = s
		return Replaced
	case s.Revision == cur.Revision:
		return Same
	}
	return Stale
}

// Len returns the number of windows held.
func (m *Merged) Len() int { return len(m.m) }

// Get returns the highest revision of a window.
func (m *Merged) Get(k Key) (Summary, bool) {
	s, ok := m.m[k]
	return s, ok
}

// All returns the summaries held, by gateway, device, metric and window.
func (m *Merged) All() []Summary {
	out := make([]Summary, 0, len(m.m))
	for _, s := range m.m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Summary) int {
		if c := strings.Compare(a.Gateway, b.Gateway); c != 0 {
			return c
		}
		if c := strings.Compare(a.Device, b.Device); c != 0 {
			return c
		}
		if c := strings.Compare(a.Metric, b.Metric); c != 0 {
			return c
		}
		return a.WindowStart.Compare(b.WindowStart)
	})
	return out
}

// Reset empties m, keeping its storage.
func (m *Merged) Reset() { clear(m.m) }
