package bridge

import (
	"encoding/binary"
	"errors"
)

// Records are kept in the outbound queue in this encoding:
//
//	version (1 byte, 1)
//	topic, key: uvarint length + bytes each
//	header count (uvarint), then key and value of each: uvarint length + bytes
//	value: the rest
const recordVersion = 1

func encodeRecord(b []byte, r Record) []byte {
	b = append(b, recordVersion)
	b = appendBytes(b, []byte(r.Topic))
	b = appendBytes(b, r.Key)
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	for _, h := range r.Headers {
		b = appendBytes(b, []byte(h.Key))
		b = appendBytes(b, []byte(h.Value))
	}
	return append(b, r.Value...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errRecord = errors.New("undecodable outbound record")

// interner returns a shared string for bytes it has seen before (topics and
// header values repeat on every record), so decoding them allocates nothing.
type interner map[string]string

func (in interner) get(b []byte) string {
	if s, ok := in[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if len(in) > 256 {
		return string(b)
	}
	s := string(b)
	in[s] = s
	return s
}

// decodeRecord decodes a queued record. Key and value alias one copy of b;
// strings come from in.
func decodeRecord(b []byte, in interner) (Record, error) {
	if len(b) == 0 || b[0] != recordVersion {
		return Record{}, errRecord
	}
	b = append([]byte(nil), b[1:]...)
	next := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		s := b[k : k+int(n) : k+int(n)]
		b = b[k+int(n):]
		return s, true
	}
	var r Record
	topic, ok1 := next()
	key, ok2 := next()
	if !ok1 || !ok2 {
		return Record{}, errRecord
	}
	r.Topic, r.Key = in.get(topic), key
	nh, k := binary.Uvarint(b)
	if k <= 0 || nh > uint64(len(b)) {
		return Record{}, errRecord
	}
	b = b[k:]
	if nh > 0 {
		r.Headers = make([]Header, 0, nh)
	}
	for range nh {
		hk, ok1 := next()
		hv, ok2 := next()
		if !ok1 || !ok2 {
			return Record{}, errRecord
		}
		r.Headers = append(r.Headers, Header{in.get(hk), in.get(hv)})
	}
	r.Value = b
	return r, nil
}
