package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

const (
	headerSize   = 8
	frameHeader  = 16
	maxPayload   = 16 << 20
	formatVer    = 1
	segmentMagic = "EGQL"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrTooLarge is returned by Append for a record over 16 MiB.
var ErrTooLarge = errors.New("queue: record larger than 16 MiB")

// segmentHeader returns the 8 bytes a segment starts with.
func segmentHeader() []byte {
	h := make([]byte, headerSize)
	copy(h, segmentMagic)
	h[4] = formatVer
	return h
}

func validHeader(h []byte) bool {
	return len(h) >= headerSize && string(h[:4]) == segmentMagic && h[4] == formatVer && h[5] == 0 && h[6] == 0 && h[7] == 0
}

// appendFrame appends one frame holding payload to b.
func appendFrame(b []byte, seq uint64, payload []byte) []byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[8:16], seq)
	crc := crc32.Update(0, castagnoli, h[8:16])
	crc = crc32.Update(crc, castagnoli, payload)
	binary.LittleEndian.PutUint32(h[4:8], crc)
	b = append(b, h[:]...)
	return append(b, payload...)
}

// frameSize is the bytes a record of n payload bytes takes on disk.
func frameSize(n int) int64 { return int64(frameHeader + n) }

// FrameError says why a frame is invalid.
type FrameError struct {
	Offset int64 // offset of the frame in its file
	Reason string
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("invalid frame at offset %d: %s", e.Offset, e.Reason)
}

// parseFrame decodes the frame at the start of b, which was read from
// offset off. It returns the frame's total length. want is the sequence
// number the frame must carry.
func parseFrame(b []byte, off int64, want uint64) (payload []byte, n int, err error) {
	if len(b) < frameHeader {
		return nil, 0, &FrameError{off, "torn header"}
	}
	l := binary.LittleEndian.Uint32(b[0:4])
	if l == 0 || l > maxPayload {
		return nil, 0, &FrameError{off, fmt.Sprintf("bad length %d", l)}
	}
	if len(b) < frameHeader+int(l) {
		return nil, 0, &FrameError{off, "torn payload"}
	}
	crc := crc32.Update(0, castagnoli, b[8:16+l])
	if crc != binary.LittleEndian.Uint32(b[4:8]) {
		return nil, 0, &FrameError{off, "checksum mismatch"}
	}
	if seq := binary.LittleEndian.Uint64(b[8:16]); seq != want {
		return nil, 0, &FrameError{off, fmt.Sprintf("sequence %d, expected %d", seq, want)}
	}
	return b[16 : 16+l], frameHeader + int(l), nil
}
