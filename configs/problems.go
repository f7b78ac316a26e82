package configs

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Key is the key's path, as in kafka.brokers[0] or mqtt.acl.users.ops;
	// empty for the file as a whole.
	Key string
	// Line is the key's line in the file; 0 when the key is not in it, or
	// there is no file (Validate).
	Line int
	// Msg says what is wrong, then, after "; ", how to fix it.
	Msg string
	// Unset says that the key is not in the file: what is wrong is its
	// default, or its absence.
	Unset bool
}

// key is the problem's key as a message shows it.
func (p Problem) key() string {
	if p.Unset {
		return p.Key + " (not in the file)"
	}
	return p.Key
}

// String is the problem on its own line, its line number between what is
// wrong and the fix: `mqtt.listn: unknown key (line 3); did you mean
// mqtt.listen?`.
func (p Problem) String() string {
	msg := p.Msg
	if p.Line > 0 {
		what, fix := cutFix(msg)
		msg = fmt.Sprintf("%s (line %d)%s", what, p.Line, fix)
	}
	if p.Key == "" {
		return msg
	}
	return p.key() + ": " + msg
}

// cutFix splits msg at its first "; " outside a quoted value, so that the
// line number goes after what is wrong even when the value has a "; ".
func cutFix(msg string) (what, fix string) {
	quoted := false
	for i := 0; i < len(msg); i++ {
		switch {
		case quoted && msg[i] == '\\':
			i++
		case msg[i] == '"':
			quoted = !quoted
		case !quoted && strings.HasPrefix(msg[i:], "; "):
			return msg[:i], msg[i:]
		}
	}
	return msg, ""
}

// Problems is every problem found in a configuration: Parse and Validate
// return it as their error, so that one run reports them all and a caller
// can inspect each (errors.As).
type Problems []Problem

// Error lists the problems by line, those without a line last. One problem
// stays on one line; more are headed by their count, one per line:
//
//	2 problems:
//	  line 3: mqtt.listn: unknown key; did you mean mqtt.listen?
//	  kafka.brokers (not in the file): is required; list your Kafka ...
func (ps Problems) Error() string {
	if len(ps) == 1 {
		return ps[0].String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems:", len(ps))
	for _, p := range ps.sorted() {
		b.WriteString("\n  ")
		if p.Line > 0 {
			fmt.Fprintf(&b, "line %d: ", p.Line)
		}
		if p.Key != "" {
			b.WriteString(p.key() + ": ")
		}
		b.WriteString(p.Msg)
	}
	return b.String()
}

// sorted returns the problems in the order Error lists them.
func (ps Problems) sorted() Problems {
	s := slices.Clone(ps)
	slices.SortStableFunc(s, func(a, b Problem) int {
		if (a.Line == 0) != (b.Line == 0) {
			return cmp.Compare(b.Line, a.Line) // the one with a line first
		}
		return cmp.Or(cmp.Compare(a.Line, b.Line), strings.Compare(a.Key, b.Key), strings.Compare(a.Msg, b.Msg))
	})
	return s
}
