package queue

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRecover writes arbitrary bytes as the active segment and checks the
// recovery invariants: Open never fails on content, the records it keeps
// are exactly the longest valid prefix of frames, the file is cut right
// after them, and the log then appends and reopens normally.
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
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, segName(1))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		// The independent view: the longest valid prefix of frames.
		var want [][]byte
		end := int64(headerSize)
		if validHeader(data) {
			for seq := uint64(1); ; seq++ {
				p, n, err := parseFrame(data[end:], end, seq)
				if err != nil {
					break
				}
				want = append(want, append([]byte(nil), p...))
				end += int64(n)
			}
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
		if err != nil || seq != uint64(len(want))+1 {
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
