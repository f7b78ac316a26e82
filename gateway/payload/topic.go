// Package payload turns MQTT publications into readings: it matches topics
// against the configured patterns (with {device} and {metric} segments) and
// decodes the payload forms of SPEC.md, "Data contracts: MQTT input": a bare
// number, {"v":..,"t":..}, a JSON object of metrics, and a SenML JSON pack
// (RFC 8428). It also decodes Sparkplug B protobuf payloads (sparkplug.go);
// what they mean (births, aliases, seq) is gateway/sparkplug's.
//
// Decoding does not allocate for the bare-number and {"v"} forms; JSON is
// read by a small purpose-built scanner rather than encoding/json, and is
// fuzzed against encoding/json for agreement.
package payload

import (
	"fmt"
	"strings"
)

// Pattern is one compiled topic pattern.
type Pattern struct {
	text     string
	segments []string // literal segment, or "" for a placeholder
	device   int      // index of {device}, -1 if absent
	metric   int      // index of {metric}, -1 if absent
}

// String returns the pattern as written.
func (p *Pattern) String() string { return p.text }

// HasMetric reports whether the pattern names the metric in the topic.
func (p *Pattern) HasMetric() bool { return p.metric >= 0 }

// Filter returns the MQTT subscription filter that matches the pattern's
// topics ({device} and {metric} become +).
func (p *Pattern) Filter() string {
	segs := make([]string, len(p.segments))
	for i, s := range p.segments {
		if s == "" {
			s = "+"
		}
		segs[i] = s
	}
	return strings.Join(segs, "/")
}

// CompilePattern checks and compiles a topic pattern such as
// "sensors/{device}/{metric}". Placeholders must fill a whole segment; each
// may appear at most once; MQTT wildcards are not allowed.
func CompilePattern(text string) (*Pattern, error) {
	if text == "" {
		return nil, fmt.Errorf("topic pattern is empty")
	}
	p := &Pattern{text: text, device: -1, metric: -1}
	for i, seg := range strings.Split(text, "/") {
		switch {
		case seg == "{device}":
			if p.device >= 0 {
				return nil, fmt.Errorf("topic pattern %q: {device} appears twice", text)
			}
			p.device = i
			seg = ""
		case seg == "{metric}":
			if p.metric >= 0 {
				return nil, fmt.Errorf("topic pattern %q: {metric} appears twice", text)
			}
			p.metric = i
			seg = ""
		case strings.ContainsAny(seg, "+#"):
			return nil, fmt.Errorf("topic pattern %q: MQTT wildcards (+, #) are not allowed; use {device} or {metric}", text)
		case strings.ContainsAny(seg, "{}"):
			return nil, fmt.Errorf("topic pattern %q: segment %q: only {device} and {metric} are known, and they must fill a whole segment", text, seg)
		case seg == "":
			return nil, fmt.Errorf("topic pattern %q: empty segment", text)
		}
		p.segments = append(p.segments, seg)
	}
	return p, nil
}

// Match reports whether topic matches the pattern and returns the device and
// metric segments (empty where the pattern has none). It does not allocate:
// the results are substrings of topic.
func (p *Pattern) Match(topic string) (device, metric string, ok bool) {
	rest := topic
	for i, lit := range p.segments {
		var seg string
		j := strings.IndexByte(rest, '/')
		if j < 0 {
			if i != len(p.segments)-1 {
				return "", "", false
			}
			seg, rest = rest, ""
		} else {
			if i == len(p.segments)-1 {
				return "", "", false
			}
			seg, rest = rest[:j], rest[j+1:]
		}
		switch {
		case lit != "":
			if seg != lit {
				return "", "", false
			}
		case seg == "":
			return "", "", false // a placeholder never matches an empty segment
		case i == p.device:
			device = seg
		case i == p.metric:
			metric = seg
		}
	}
	return device, metric, true
}
