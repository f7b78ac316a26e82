package queue

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRecover writes arbitrary bytes as the active segment and checks the
// recovery invariants: Open never fails on content; the records it keeps
// are exactly the valid frames in sequence order, damage between them
// skipped (each next frame is the earliest valid one whose sequence number
// does not go back); the file is cut right after the last; and the log
// then appends and reopens normally.
func FuzzRecover(f *testing.F) {
	valid := segmentHeader()
	for i := uint64(1); i <= 3; i++ {
		valid = appendFrame(valid, i, rec(i))
	}
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(append(append([]byte{}, valid...), make([]byte, 64)...))
	f.Add([]byte("EGQL"))
	f.Add([]byte{})
	bad := append([]byte{}, valid...)
	bad[headerSize+20] ^= 0xff
	f.Add(bad)
	// A valid frame right after a damaged header's first byte, and one that
	// is valid but ahead of the sequence it should carry: both are kept.
	f.Add([]byte("0\x10\x00\x00\x00\xadP{\x05\x02\x00\x00\x00\x00\x00\x00\x00record-000002-xx0"))
	f.Add([]byte("EGQL\x01\x00\x00\x00\x11\x00\x00\x00\x87y\x7f\xa2\x03\x00\x00\x00\x00\x00\x00\x00record-000003-xxx"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, segName(1))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		// The independent view: every offset where a whole frame with a
		// valid length and checksum starts, then a walk through them.
		type frame struct {
			off, end int64
			seq      uint64
			payload  []byte
		}
		start := int64(1)
		if validHeader(data) {
			start = headerSize
		}
		var frames []frame
		for off := start; off+frameHeader <= int64(len(data)); off++ {
			l := int64(binary.LittleEndian.Uint32(data[off:]))
			if l == 0 || l > maxPayload || off+frameHeader+l > int64(len(data)) {
				continue
			}
			b := data[off : off+frameHeader+l]
			if crc32.Checksum(b[8:], castagnoli) == binary.LittleEndian.Uint32(b[4:]) {
				frames = append(frames, frame{off, off + frameHeader + l, binary.LittleEndian.Uint64(b[8:]), b[frameHeader:]})
			}
		}
		var want [][]byte
		end, next, pos := int64(headerSize), uint64(1), start
		for _, fr := range frames {
			if fr.off < pos || fr.seq < next || fr.seq-next > maxSkip {
				continue
			}
			want = append(want, fr.payload)
			end, next, pos = fr.end, fr.seq+1, fr.end
		}
		l, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		r := l.NewReader(1)
		var got [][]byte
		for {
			_, p, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			got = append(got, append([]byte(nil), p...))
		}
		r.Close()
		if len(got) != len(want) {
			t.Fatalf("kept %d records, want %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("record %d differs", i+1)
			}
		}
		if fi, _ := os.Stat(path); fi.Size() != end {
			t.Fatalf("file is %d bytes after recovery, want %d", fi.Size(), end)
		}
		seq, err := l.Append([]byte("after"))
		if err != nil || seq != next {
			t.Fatalf("Append = %d, %v", seq, err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l2.Close()
		if st := l2.Stats(); st.Next != seq+1 || st.Truncated != 0 {
			t.Fatalf("reopen: %+v", st)
		}
	})
}
