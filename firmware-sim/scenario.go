package firmwaresim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Scenario is a named fleet set-up, read from YAML (configs/sim/*.yaml).
type Scenario struct {
	Name        string           `yaml:"name"`
	Description string           `yaml:"description"`
	Duration    Duration         `yaml:"duration"`
	Seed        uint64           `yaml:"seed"`
	StormEvery  Duration         `yaml:"storm_every"`
	Groups      []Group          `yaml:"groups"`
	Subscribers []SubscriberSpec `yaml:"subscribers"`
}

// Group is a set of alike devices, named <name>-0001, <name>-0002, ...
type Group struct {
	Name     string   `yaml:"name"`
	Count    int      `yaml:"count"`
	Interval Duration `yaml:"interval"`
	QoS      int      `yaml:"qos"`
	// Form: bare, v+t, object, senml, or mixed (cycling through them);
	// or sparkplug: Sparkplug B edge nodes (see sparkplug.go).
	Form string `yaml:"form"`
	// Protocol: "5", "3.1.1", or "mixed" (every other device).
	Protocol string `yaml:"protocol"`
	// Username and Password of each device; {id} stands for its id. Empty
	// username: anonymous.
	Username   string          `yaml:"username"`
	Password   string          `yaml:"password"`
	Metrics    []MetricSpec    `yaml:"metrics"` // default: temperature, humidity, pressure
	Behaviours []BehaviourSpec `yaml:"behaviours"`
}

// MetricSpec is a metric and its signal.
type MetricSpec struct {
	Name       string   `yaml:"name"`
	Unit       string   `yaml:"unit"`
	Base       float64  `yaml:"base"`
	Drift      float64  `yaml:"drift_per_hour"`
	Amplitude  float64  `yaml:"amplitude"`
	Period     Duration `yaml:"period"` // 24h for a diurnal cycle
	Noise      float64  `yaml:"noise"`
	Resolution float64  `yaml:"resolution"`
	StepEvery  Duration `yaml:"step_every"`
	StepSize   float64  `yaml:"step_size"`
}

// BehaviourSpec gives a behaviour to a fraction of a group's devices.
type BehaviourSpec struct {
	Fraction float64 `yaml:"fraction"` // 0 < fraction <= 1
	Offline  *struct {
		Every      Duration `yaml:"every"`
		For        Duration `yaml:"for"`
		Interleave bool     `yaml:"interleave"`
	} `yaml:"offline"`
	ClockSkew     Duration `yaml:"clock_skew"`
	ClockDriftPPM float64  `yaml:"clock_drift_ppm"`
	// Clock: "unset" (counts from 1970 at the start, as an ESP32 before
	// SNTP), "stale 72h" (that far behind: a Raspberry Pi's saved time) or
	// "ahead 2h"; StepAt, after the start, sets it right (a step to true
	// time). Empty: true time, with clock_skew and clock_drift_ppm.
	Clock         string   `yaml:"clock"`
	StepAt        Duration `yaml:"step_at"`
	Duplicates    float64  `yaml:"duplicate_probability"`
	ReorderWithin Duration `yaml:"reorder_within"`
	Malformed     float64  `yaml:"malformed_probability"`
	// AliasLoss is, for Sparkplug edge nodes, the chance per sample of
	// renumbering the aliases without a rebirth.
	AliasLoss float64 `yaml:"alias_loss_probability"`
}

// SubscriberSpec is a set of slow consumers.
type SubscriberSpec struct {
	Name     string   `yaml:"name"`
	Count    int      `yaml:"count"`
	Filter   string   `yaml:"filter"`
	Delay    Duration `yaml:"delay"`
	Username string   `yaml:"username"`
	Password string   `yaml:"password"`
}

// Duration is a time.Duration written as 90s, 1m, 24h.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return fmt.Errorf("line %d: %q is not a duration; use Go syntax such as 90s, 1m or 24h", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// LoadScenario reads and checks a scenario file.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	s, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	return s, nil
}

// ParseScenario decodes a scenario strictly (unknown keys are errors) and
// checks its values.
func ParseScenario(data []byte) (*Scenario, error) {
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("not a valid scenario: %w", err)
	}
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if s.Name == "" {
		add("name: is empty")
	}
	if s.Duration <= 0 {
		add("duration: must be positive, e.g. 2m")
	}
	if len(s.Groups) == 0 {
		add("groups: list at least one group of devices")
	}
	names := map[string]bool{}
	for i, g := range s.Groups {
		at := fmt.Sprintf("groups[%d]", i)
		if g.Name == "" || strings.ContainsAny(g.Name, "/+# ") || names[g.Name] {
			add("%s.name: %q must be unique, non-empty, without '/', '+', '#' or spaces", at, g.Name)
		}
		names[g.Name] = true
		if g.Count < 1 {
			add("%s.count: must be at least 1", at)
		}
		if g.Interval.D() < time.Millisecond {
			add("%s.interval: must be at least 1ms", at)
		}
		if g.QoS < 0 || g.QoS > 2 {
			add("%s.qos: %d; use 0, 1 or 2", at, g.QoS)
		}
		if _, ok := forms[g.Form]; !ok && g.Form != "mixed" && g.Form != "" {
			add("%s.form: %q; use bare, v+t, object, senml, mixed or sparkplug", at, g.Form)
		}
		switch g.Protocol {
		case "", "5", "3.1.1", "mixed":
		default:
			add("%s.protocol: %q; use 5, 3.1.1 or mixed", at, g.Protocol)
		}
		for j, b := range g.Behaviours {
			bt := fmt.Sprintf("%s.behaviours[%d]", at, j)
			if b.Fraction <= 0 || b.Fraction > 1 {
				add("%s.fraction: %g; use more than 0 and at most 1", bt, b.Fraction)
			}
			if o := b.Offline; o != nil && (o.Every <= 0 || o.For <= 0 || o.For >= o.Every) {
				add("%s.offline: want 0 < for < every", bt)
			}
			if _, _, err := parseClock(b.Clock); err != nil {
				add("%s.clock: %v", bt, err)
			}
			if b.StepAt < 0 {
				add("%s.step_at: must not be negative", bt)
			}
			for name, v := range map[string]float64{"duplicate_probability": b.Duplicates, "malformed_probability": b.Malformed, "alias_loss_probability": b.AliasLoss} {
				if v < 0 || v > 1 {
					add("%s.%s: %g; use 0 to 1", bt, name, v)
				}
			}
		}
	}
	for i, sub := range s.Subscribers {
		if sub.Count < 1 || sub.Filter == "" || sub.Name == "" {
			add("subscribers[%d]: want name, count >= 1 and a filter", i)
		}
	}
	if len(p) > 0 {
		return nil, errors.New(strings.Join(p, "; "))
	}
	return &s, nil
}

var forms = map[string]Form{"bare": FormBare, "v+t": FormVT, "object": FormObject, "senml": FormSenML, "sparkplug": FormSparkplug}

// parseClock reads a behaviour's clock: "", "unset", "stale <duration>"
// or "ahead <duration>".
func parseClock(s string) (unset bool, offset time.Duration, err error) {
	word, arg, _ := strings.Cut(strings.TrimSpace(s), " ")
	switch word {
	case "":
		return false, 0, nil
	case "unset":
		if arg != "" {
			return false, 0, fmt.Errorf("%q: unset takes no duration", s)
		}
		return true, 0, nil
	case "stale", "ahead":
		d, err := time.ParseDuration(strings.TrimSpace(arg))
		if err != nil || d <= 0 {
			return false, 0, fmt.Errorf("%q: want %s and a positive duration, e.g. %s 72h", s, word, word)
		}
		if word == "stale" {
			d = -d
		}
		return false, d, nil
	}
	return false, 0, fmt.Errorf("%q: use unset, stale <duration> or ahead <duration>", s)
}

// Fleet builds the scenario's fleet against addr.
func (s *Scenario) Fleet(addr string) *Fleet {
	f := &Fleet{Addr: addr, Seed: s.Seed, StormEvery: s.StormEvery.D()}
	for _, g := range s.Groups {
		for i := range g.Count {
			id := fmt.Sprintf("%s-%04d", g.Name, i+1)
			d := Device{ID: id, Interval: g.Interval.D(), QoS: byte(g.QoS), Protocol: 5,
				Username: strings.ReplaceAll(g.Username, "{id}", id), Password: strings.ReplaceAll(g.Password, "{id}", id)}
			if fm, ok := forms[g.Form]; ok {
				d.Form = fm
			} else if g.Form == "mixed" {
				d.Form = Form(i % 4)
			}
			if g.Protocol == "3.1.1" || (g.Protocol == "mixed" && i%2 == 1) {
				d.Protocol = 4
			}
			d.Metrics = Environmental()
			if len(g.Metrics) > 0 {
				d.Metrics = nil
				for _, m := range g.Metrics {
					d.Metrics = append(d.Metrics, Metric{Name: m.Name, Unit: m.Unit, Signal: Signal{Base: m.Base, Drift: m.Drift,
						Amplitude: m.Amplitude, Period: m.Period.D(), Noise: m.Noise, Resolution: m.Resolution,
						StepEvery: m.StepEvery.D(), StepSize: m.StepSize}})
				}
			}
			for j, b := range g.Behaviours {
				// Each behaviour takes the first fraction of the group,
				// counted from its own offset so behaviours spread.
				n := int(math.Ceil(b.Fraction * float64(g.Count)))
				if (i+j*g.Count/max(1, len(g.Behaviours)))%g.Count >= n {
					continue
				}
				if o := b.Offline; o != nil {
					d.OfflineEvery, d.OfflineFor, d.Interleave = o.Every.D(), o.For.D(), o.Interleave
				}
				if b.ClockSkew != 0 {
					d.ClockSkew = b.ClockSkew.D()
				}
				if b.ClockDriftPPM != 0 {
					d.ClockDrift = b.ClockDriftPPM / 1e6
				}
				if unset, off, _ := parseClock(b.Clock); unset || off != 0 {
					d.ClockUnset, d.ClockOffset = unset, off
				}
				if b.StepAt > 0 {
					d.ClockStepAt = b.StepAt.D()
				}
				d.DuplicateProb = max(d.DuplicateProb, b.Duplicates)
				d.MalformedProb = max(d.MalformedProb, b.Malformed)
				d.AliasLossProb = max(d.AliasLossProb, b.AliasLoss)
				if b.ReorderWithin > 0 {
					d.ReorderWithin = b.ReorderWithin.D()
				}
			}
			f.Devices = append(f.Devices, d)
		}
	}
	for _, sub := range s.Subscribers {
		for i := range sub.Count {
			id := fmt.Sprintf("%s-%04d", sub.Name, i+1)
			f.Subscribers = append(f.Subscribers, Subscriber{ID: id, Filter: sub.Filter, Delay: sub.Delay.D(),
				Username: strings.ReplaceAll(sub.Username, "{id}", id), Password: strings.ReplaceAll(sub.Password, "{id}", id)})
		}
	}
	return f
}

// Scale runs the scenario k times faster: every duration in it (the run,
// intervals, signal periods, outages, skews, stale or ahead clocks and
// when they are set right, reorder bounds, storms, subscriber delays) is
// divided by k. Tests and demos use it with a gateway whose window
// settings are divided by k too.
func (s *Scenario) Scale(k float64) {
	if k <= 0 || k == 1 {
		return
	}
	div := func(d *Duration) { *d = Duration(float64(*d) / k) }
	div(&s.Duration)
	div(&s.StormEvery)
	for i := range s.Groups {
		g := &s.Groups[i]
		div(&g.Interval)
		for j := range g.Metrics {
			div(&g.Metrics[j].Period)
			div(&g.Metrics[j].StepEvery)
		}
		for j := range g.Behaviours {
			b := &g.Behaviours[j]
			if b.Offline != nil {
				o := *b.Offline
				div(&o.Every)
				div(&o.For)
				b.Offline = &o
			}
			div(&b.ClockSkew)
			div(&b.ReorderWithin)
			div(&b.StepAt)
			if unset, off, err := parseClock(b.Clock); err == nil && !unset && off != 0 {
				word := "ahead"
				if off < 0 {
					word, off = "stale", -off
				}
				b.Clock = word + " " + time.Duration(float64(off)/k).String()
			}
		}
	}
	for i := range s.Subscribers {
		div(&s.Subscribers[i].Delay)
	}
}
