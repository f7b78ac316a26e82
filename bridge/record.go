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

// decodeRecord decodes a queued record. The result shares no memory with b.
func decodeRecord(b []byte) (Record, error) {
	if len(b) == 0 || b[0] != recordVersion {
		return Record{}, errRecord
	}
	b = b[1:]
	next := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		s := append([]byte(nil), b[k:k+int(n)]...)
		b = b[k+int(n):]
		return s, true
	}
	var r Record
	topic, ok1 := next()
	key, ok2 := next()
	if !ok1 || !ok2 {
		return Record{}, errRecord
	}
	r.Topic, r.Key = string(topic), key
	nh, k := binary.Uvarint(b)
	if k <= 0 || nh > uint64(len(b)) {
		return Record{}, errRecord
	}
	b = b[k:]
	for range nh {
		hk, ok1 := next()
		hv, ok2 := next()
		if !ok1 || !ok2 {
			return Record{}, errRecord
		}
		r.Headers = append(r.Headers, Header{string(hk), string(hv)})
	}
	r.Value = append([]byte(nil), b...)
	return r, nil
}
