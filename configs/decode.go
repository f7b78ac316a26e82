package configs

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decoder decodes a YAML document into a Config key by key, rather than
// with one yaml Decode, so that a bad value costs only itself: it is
// reported with its key and line, keeps its default, and decoding goes on
// to the keys after it.
type decoder struct {
	lines    map[string]int // the line of every key in the file
	problems Problems
	// failed are the keys whose value was not taken (bad, or of the wrong
	// type), suggested the keys an unknown key was taken to be a
	// misspelling of: Validate's complaints about them, or about a key
	// within or above them, would only repeat the problem.
	failed, suggested []string
}

func (d *decoder) fail(key string, line int, format string, args ...any) {
	d.problems = append(d.problems, Problem{Key: key, Line: line, Msg: fmt.Sprintf(format, args...)})
	d.failed = append(d.failed, key)
}

// consequential reports whether a problem with key follows from one the
// decoder reported.
func (d *decoder) consequential(key string) bool {
	related := func(a, b string) bool {
		return a == b || within(a, b) || within(b, a)
	}
	for _, f := range d.failed {
		if related(key, f) {
			return true
		}
	}
	for _, s := range d.suggested {
		if _, set := d.lines[s]; !set && related(key, s) {
			return true
		}
	}
	return false
}

// within reports whether key is inside the section or list parent; every
// key is inside the file as a whole ("").
func within(key, parent string) bool {
	return parent == "" || strings.HasPrefix(key, parent+".") || strings.HasPrefix(key, parent+"[")
}

// decode decodes n into v, the value of key, whose line is line. A null
// keeps v's default, as yaml does, but empties a list or mapping.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, key string, line int) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.ShortTag() == "!!null" {
		if k := v.Kind(); k == reflect.Slice || k == reflect.Map {
			v.SetZero()
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.fields(n, v, key, line)
	case reflect.Slice:
		d.list(n, v, key, line)
	case reflect.Map:
		d.mapping(n, v, key, line)
	default:
		d.value(n, v, key, line)
	}
}

// fields decodes a section of keys into the struct v, reporting the keys
// it does not have and those given twice.
func (d *decoder) fields(n *yaml.Node, v reflect.Value, key string, line int) {
	if n.Kind != yaml.MappingNode {
		if key == "" {
			d.fail(key, n.Line, "the file holds %s, not sections of keys; start from edgegate.yaml (gateway:, mqtt:, kafka:, ...)", describe(n))
			return
		}
		d.fail(key, line, "%s is not a section of keys; write its keys on the lines below it, indented, or as {key: value, ...}", describe(n))
		return
	}
	t := v.Type()
	fields := map[string]int{}
	var names []string
	for i := range t.NumField() {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		fields[tag] = i
		names = append(names, tag)
	}
	sort.Strings(names)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		full := joinPath(key, k.Value)
		if d.merge(k, full) {
			continue
		}
		f, ok := fields[k.Value]
		if !ok {
			if s := closest(k.Value, names); s != "" {
				d.problems = append(d.problems, Problem{Key: full, Line: k.Line, Msg: fmt.Sprintf("unknown key; did you mean %s?", joinPath(key, s))})
				d.suggested = append(d.suggested, joinPath(key, s))
			} else {
				d.problems = append(d.problems, Problem{Key: full, Line: k.Line, Msg: "unknown key; known keys here: " + strings.Join(names, ", ")})
			}
			continue
		}
		if d.twice(seen, k, full) {
			continue
		}
		d.lines[full] = k.Line
		d.decode(val, v.Field(f), full, k.Line)
	}
}

// merge reports a merge key (<<: *anchor), which yaml would expand but
// this decoder does not, as it would lose the lines of the keys merged.
func (d *decoder) merge(k *yaml.Node, full string) bool {
	if k.ShortTag() != "!!merge" {
		return false
	}
	d.problems = append(d.problems, Problem{Key: full, Line: k.Line, Msg: "merge keys are not supported; write the keys out"})
	return true
}

// twice reports a key given a second time in one mapping; the first one
// counts.
func (d *decoder) twice(seen map[string]int, k *yaml.Node, full string) bool {
	if first, ok := seen[k.Value]; ok {
		d.problems = append(d.problems, Problem{Key: full, Line: k.Line, Msg: fmt.Sprintf("duplicate key, already set on line %d; keep one", first)})
		return true
	}
	seen[k.Value] = k.Line
	return false
}

// list decodes a sequence into the slice v; its items are key[0], key[1]...
func (d *decoder) list(n *yaml.Node, v reflect.Value, key string, line int) {
	if n.Kind != yaml.SequenceNode {
		d.fail(key, line, "%s is not a list; write [a, b], or one \"- item\" line per item below it", describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		full := fmt.Sprintf("%s[%d]", key, i)
		d.lines[full] = item.Line
		d.decode(item, s.Index(i), full, item.Line)
	}
	v.Set(s)
}

// mapping decodes a mapping into the map v; its entries are key.name.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, key string, line int) {
	if n.Kind != yaml.MappingNode {
		d.fail(key, line, "%s is not a mapping; write its entries as name: value lines below it, indented, or as {name: value, ...}", describe(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		full := joinPath(key, k.Value)
		if d.merge(k, full) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(key, k.Line, "%s is not a name; write a plain name before the colon", describe(k))
			continue
		}
		if d.twice(seen, k, full) {
			continue
		}
		d.lines[full] = k.Line
		e := reflect.New(v.Type().Elem()).Elem()
		d.decode(val, e, full, k.Line)
		v.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), e)
	}
}

var linePrefix = regexp.MustCompile(`^line \d+: `)

// value decodes a scalar into v, which keeps its value if n does not fit.
func (d *decoder) value(n *yaml.Node, v reflect.Value, key string, line int) {
	p := reflect.New(v.Type())
	err := n.Decode(p.Interface())
	if err == nil {
		v.Set(p.Elem())
		return
	}
	// Duration and ByteSize say themselves what is wrong and how to write
	// it; the line is reported apart.
	var te *yaml.TypeError
	if _, ok := p.Interface().(yaml.Unmarshaler); ok && errors.As(err, &te) && len(te.Errors) == 1 {
		d.fail(key, line, "%s", linePrefix.ReplaceAllString(te.Errors[0], ""))
		return
	}
	d.fail(key, line, "%s", wrongType(n, v))
}

// wrongType says why n is not a value of v's type, and what to write
// instead, with v's default as the example.
func wrongType(n *yaml.Node, v reflect.Value) string {
	eg := ""
	if !v.IsZero() {
		eg = fmt.Sprintf(", e.g. %v (the default)", v.Interface())
	}
	switch v.Kind() {
	case reflect.Bool:
		return describe(n) + " is not true or false; write true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return describe(n) + " is not a whole number; write digits" + eg
	case reflect.Float32, reflect.Float64:
		return describe(n) + " is not a number; write one" + eg
	}
	return describe(n) + " is not a single value; write one, in quotes if it starts with { or [ or holds \": \""
}

// describe names what n is, for a message: its value, or "a list" or "a
// mapping".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return fmt.Sprintf("%q", n.Value)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// closest returns the known key nearest to s by edit distance, if close.
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(s, n); d < bestD || (d <= 3 && strings.Contains(n, s) && len(s) >= 3) {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
