package payload

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner reads RFC 8259 JSON from a byte slice, one token at a time. It is
// just enough for the payload forms: objects, arrays, strings, numbers,
// literals. Depth is bounded to keep hostile input from recursing deeply.
type scanner struct {
	b []byte
	i int
}

const maxDepth = 32

var (
	errSyntax  = errors.New("invalid JSON")
	errDepth   = errors.New("JSON nested too deeply")
	errTrailer = errors.New("invalid JSON: data after the value")
)

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errSyntax
	}
	s.i++
	return nil
}

// end checks that only white space follows.
func (s *scanner) end() error {
	if s.peek() != 0 || s.i < len(s.b) {
		return errTrailer
	}
	return nil
}

// rawString reads a string token and returns its bytes without the quotes,
// and whether it contains escapes (then use unquote).
func (s *scanner) rawString() (raw []byte, escaped bool, err error) {
	if s.peek() != '"' {
		return nil, false, errSyntax
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[start:s.i]
			s.i++
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return nil, false, errSyntax
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if _, ok := hex4(s.b[s.i+2:]); !ok {
					return nil, false, errSyntax
				}
				s.i += 6
			default:
				return nil, false, errSyntax
			}
		case c < 0x20:
			return nil, false, errSyntax
		default:
			s.i++
		}
	}
	return nil, false, errSyntax
}

// str reads a string token and returns it as a Go string (allocating).
func (s *scanner) str() (string, error) {
	raw, esc, err := s.rawString()
	if err != nil {
		return "", err
	}
	if !esc {
		if !utf8.Valid(raw) {
			return string([]rune(string(raw))), nil // replace bad bytes with U+FFFD, as encoding/json
		}
		return string(raw), nil
	}
	return unquote(raw)
}

func unquote(raw []byte) (string, error) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			r, size := utf8.DecodeRune(raw[i:])
			out = utf8.AppendRune(out, r)
			i += size
			continue
		}
		if i+1 >= len(raw) {
			return "", errSyntax
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			out = append(out, raw[i+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw[i+2:])
			if !ok {
				return "", errSyntax
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if r2, ok := hex4(raw[min(i+2, len(raw)):]); ok && i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						out = utf8.AppendRune(out, dec)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return "", errSyntax
		}
		i += 2
	}
	return string(out), nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number reads a JSON number token.
func (s *scanner) number() (float64, error) {
	s.ws()
	start := s.i
	n := numberLen(s.b[s.i:])
	if n == 0 {
		return 0, errSyntax
	}
	s.i += n
	return parseFloat(s.b[start:s.i])
}

// numberLen returns the length of the JSON number at the start of b, or 0.
// Grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func numberLen(b []byte) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return 0
	}
	if i < len(b) && b[i] == '.' {
		d := skipDigits(b, i+1)
		if d == i+1 {
			return 0 // a fraction needs digits
		}
		i = d
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := skipDigits(b, i)
		if d == i {
			return 0 // an exponent needs digits
		}
		i = d
	}
	return i
}

// skipDigits returns the index of the first non-digit at or after i.
func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

var errRange = errors.New("number out of range")

func parseFloat(b []byte) (float64, error) {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, errRange // the grammar was checked, so only range errors remain
	}
	return f, nil
}

// literal reads true, false or null.
func (s *scanner) literal() (string, error) {
	s.ws()
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return lit, nil
		}
	}
	return "", errSyntax
}

// skip reads and discards any one value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return errDepth
	}
	switch c := s.peek(); {
	case c == '"':
		_, _, err := s.rawString()
		return err
	case c == '{':
		return s.objectFields(func([]byte, bool) error { return s.skip(depth + 1) })
	case c == '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return errSyntax
			}
		}
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		if err == errRange {
			return nil // a huge number is still valid JSON when skipped
		}
		return err
	default:
		_, err := s.literal()
		return err
	}
}

// valueKind classifies the next value without consuming it.
type valueKind uint8

const (
	kindInvalid valueKind = iota
	kindNumber
	kindString
	kindObject
	kindArray
	kindLiteral
)

func (s *scanner) kind() valueKind {
	switch c := s.peek(); {
	case c == '"':
		return kindString
	case c == '{':
		return kindObject
	case c == '[':
		return kindArray
	case c == '-' || (c >= '0' && c <= '9'):
		return kindNumber
	case c == 't' || c == 'f' || c == 'n':
		return kindLiteral
	}
	return kindInvalid
}

// objectFields calls fn for each key of an object, positioned at the value;
// fn must consume the value.
func (s *scanner) objectFields(fn func(key []byte, escaped bool) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, esc, err := s.rawString()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := fn(key, esc); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errSyntax
		}
	}
}
