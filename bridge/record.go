package bridge

import (
	"encoding/binary"
	"errors"
)

// Records are kept in the outbound queue in this encoding:
//
//	version (1 byte, 2)
//	mark: uvarint seq, uvarint n (version 2 only; see Mark)
//	topic, key: uvarint length + bytes each
//	header count (uvarint), then key and value of each: uvarint length + bytes
//	value: the rest
//
// Version 1 records (no mark) are still read.
const recordVersion = 2

// Mark names an output by what produced it: the sequence number of the
// gateway's ingest event (in its journal) and the output's index among that
// event's outputs, from 1. Marks increase in the order outputs are
// enqueued, so the mark of the last stored record tells a replay of the
// journal which outputs are already stored. The zero Mark is "none".
type Mark struct {
	Seq uint64
	N   uint32
}

// After reports whether m comes after o.
func (m Mark) After(o Mark) bool {
	return m.Seq > o.Seq || m.Seq == o.Seq && m.N > o.N
}

func encodeRecord(b []byte, r Record, m Mark) []byte {
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, m.Seq)
	b = binary.AppendUvarint(b, uint64(m.N))
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

// recordMark returns the mark of an encoded record (zero for version 1).
func recordMark(b []byte) (Mark, error) {
	if len(b) > 0 && b[0] == 1 {
		return Mark{}, nil
	}
	if len(b) == 0 || b[0] != recordVersion {
		return Mark{}, errRecord
	}
	seq, k := binary.Uvarint(b[1:])
	if k <= 0 {
		return Mark{}, errRecord
	}
	n, k2 := binary.Uvarint(b[1+k:])
	if k2 <= 0 || n > 1<<32-1 {
		return Mark{}, errRecord
	}
	return Mark{Seq: seq, N: uint32(n)}, nil
}

// decodeRecord decodes a queued record. Key and value alias one copy of b;
// strings come from in.
func decodeRecord(b []byte, in interner) (Record, error) {
	if len(b) == 0 || (b[0] != recordVersion && b[0] != 1) {
		return Record{}, errRecord
	}
	v := b[0]
	b = append([]byte(nil), b[1:]...)
	if v == recordVersion {
		for range 2 { // the mark
			_, k := binary.Uvarint(b)
			if k <= 0 {
				return Record{}, errRecord
			}
			b = b[k:]
		}
	}
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
