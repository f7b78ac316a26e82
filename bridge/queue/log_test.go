package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

func rec(i uint64) []byte {
	return []byte(fmt.Sprintf("record-%06d-%s", i, bytes.Repeat([]byte{'x'}, int(i%37))))
}

// fill writes records 1..n in batches of 7 and closes the log.
func fill(t *testing.T, dir string, n uint64, segBytes int64) {
	t.Helper()
	l, err := Open(dir, Options{SegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= n; {
		var batch [][]byte
		for j := 0; j < 7 && i <= n; j++ {
			batch = append(batch, rec(i))
			i++
		}
		if _, err := l.Append(batch...); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// readAll returns the sequence numbers read, checking each payload.
func readAll(t *testing.T, l *Log, from uint64) []uint64 {
	t.Helper()
	r := l.NewReader(from)
	defer r.Close()
	var got []uint64
	for {
		seq, p, err := r.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if !bytes.Equal(p, rec(seq)) {
			t.Fatalf("record %d = %q", seq, p)
		}
		got = append(got, seq)
	}
}

func seqs(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sort.Strings(m)
	return m
}

// frameOffset returns the file offset of record seq in a segment file.
func frameOffset(t *testing.T, path string, seq uint64) int64 {
	t.Helper()
	b, _ := os.ReadFile(path)
	first, _ := parseSegName(filepath.Base(path))
	off := int64(headerSize)
	for s := first; s < seq; s++ {
		off += frameHeader + int64(binary.LittleEndian.Uint32(b[off:]))
	}
	return off
}

func TestRoundTripAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 500, 4096)
	if n := len(segments(t, dir)); n < 5 {
		t.Fatalf("%d segments; want several", n)
	}
	l, err := Open(dir, Options{SegmentBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := readAll(t, l, 1); fmt.Sprint(got) != fmt.Sprint(seqs(1, 500)) {
		t.Fatalf("read %v", got)
	}
	if got := readAll(t, l, 250); fmt.Sprint(got) != fmt.Sprint(seqs(250, 500)) {
		t.Fatalf("read from 250: %v", got)
	}
	// Appending continues the sequence; readers see records only once synced.
	first, err := l.Append(rec(501), rec(502))
	if err != nil || first != 501 {
		t.Fatalf("Append = %d, %v", first, err)
	}
	r := l.NewReader(500)
	defer r.Close()
	if seq, _, err := r.Next(); seq != 500 || err != nil {
		t.Fatalf("Next = %d %v", seq, err)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("unsynced record visible: %v", err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if seq, _, err := r.Next(); seq != 501 || err != nil {
		t.Fatalf("after Sync: Next = %d %v", seq, err)
	}
	st := l.Stats()
	if st.First != 1 || st.Next != 503 || st.Durable != 503 || st.Truncated != 0 || st.Quarantined != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestRecovery applies a named damage to a log of 300 records in segments
// of 2 KiB, reopens it, and checks exactly which records survive, how many
// are counted lost, and what recovery reports.
func TestRecovery(t *testing.T) {
	const n, segBytes = 300, 2048
	last := func(t *testing.T, dir string) string { s := segments(t, dir); return s[len(s)-1] }
	all := func(string, []uint64) ([]uint64, uint64) { return seqs(1, n), 0 }
	tests := map[string]struct {
		damage func(t *testing.T, dir string)
		// want computes the survivors and the records counted lost from the
		// segment layout before the damage (firsts: each segment's first record).
		want        func(dir string, firsts []uint64) ([]uint64, uint64)
		truncated   int64 // -1: any > 0
		quarantined int
	}{
		"no damage": {damage: func(*testing.T, string) {}, want: all},
		"torn last frame": {
			damage: func(t *testing.T, dir string) {
				p := last(t, dir)
				fi, _ := os.Stat(p)
				os.Truncate(p, fi.Size()-3)
			},
			want:      func(string, []uint64) ([]uint64, uint64) { return seqs(1, n-1), 0 },
			truncated: frameHeader + int64(len(rec(n))) - 3,
		},
		"bad checksum in the active segment": {
			damage: func(t *testing.T, dir string) {
				p := last(t, dir)
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt([]byte{'!'}, frameOffset(t, p, n-2)+frameHeader+3)
				f.Close()
			},
			// only the damaged record is lost: the frames after it are valid
			want:        func(string, []uint64) ([]uint64, uint64) { return append(seqs(1, n-3), n-1, n), 1 },
			quarantined: 1,
		},
		"bad length in the active segment": {
			damage: func(t *testing.T, dir string) {
				p := last(t, dir)
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt([]byte{0xff, 0xff, 0xff, 0x7f}, frameOffset(t, p, n-1))
				f.Close()
			},
			want:        func(string, []uint64) ([]uint64, uint64) { return append(seqs(1, n-2), n), 1 },
			quarantined: 1,
		},
		"zero-filled tail": {
			damage: func(t *testing.T, dir string) {
				f, _ := os.OpenFile(last(t, dir), os.O_WRONLY|os.O_APPEND, 0)
				f.Write(make([]byte, 4096))
				f.Close()
			},
			want:      all,
			truncated: 4096,
		},
		// After a power cut, unsynced writes may have reached the card in
		// any order: a later batch landed, an earlier one did not, and
		// reads back as zeros. The frames after such a never-written gap
		// were not synced either (nothing after the gap was acknowledged),
		// so they are dropped with it, not kept as if only the gap were
		// lost: a queue that kept them would report records stored that
		// come after one that is not.
		"never-written gap in the active segment": {
			damage: func(t *testing.T, dir string) {
				p := last(t, dir)
				from, to := frameOffset(t, p, n-5), frameOffset(t, p, n-2)
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt(make([]byte, to-from), from)
				f.Close()
			},
			want:      func(string, []uint64) ([]uint64, uint64) { return seqs(1, n-6), 0 },
			truncated: -1,
		},
		"torn write, then a never-written gap": {
			damage: func(t *testing.T, dir string) {
				p := last(t, dir)
				from, to := frameOffset(t, p, n-5), frameOffset(t, p, n-2)
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt(make([]byte, to-from-11), from+11) // the first 11 bytes of frame n-5 landed
				f.Close()
			},
			want:      func(string, []uint64) ([]uint64, uint64) { return seqs(1, n-6), 0 },
			truncated: -1,
		},
		"active segment header destroyed": {
			damage: func(t *testing.T, dir string) {
				f, _ := os.OpenFile(last(t, dir), os.O_RDWR, 0)
				f.WriteAt([]byte("JUNK"), 0)
				f.Close()
			},
			// the frames after the header are intact
			want:        all,
			quarantined: 1,
		},
		"bad checksum in a sealed segment": {
			damage: func(t *testing.T, dir string) {
				p := segments(t, dir)[1]
				first, _ := parseSegName(filepath.Base(p))
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt([]byte{'!'}, frameOffset(t, p, first+2)+frameHeader)
				f.Close()
			},
			// only the damaged record is lost
			want: func(_ string, f []uint64) ([]uint64, uint64) {
				return append(seqs(1, f[1]+1), seqs(f[1]+3, n)...), 1
			},
			quarantined: 1,
		},
		"never-written gap in a sealed segment": {
			damage: func(t *testing.T, dir string) {
				p := segments(t, dir)[1]
				first, _ := parseSegName(filepath.Base(p))
				from, to := frameOffset(t, p, first+2), frameOffset(t, p, first+4)
				f, _ := os.OpenFile(p, os.O_RDWR, 0)
				f.WriteAt(make([]byte, to-from), from)
				f.Close()
			},
			// a damaged tail: cut at the gap
			want: func(_ string, f []uint64) ([]uint64, uint64) {
				return append(seqs(1, f[1]+1), seqs(f[2], n)...), f[2] - f[1] - 2
			},
			quarantined: 1,
		},
		"truncated sealed segment": {
			damage: func(t *testing.T, dir string) {
				p := segments(t, dir)[2]
				fi, _ := os.Stat(p)
				os.Truncate(p, fi.Size()/2)
			},
			// the records wholly inside the first half survive
			want: func(dir string, f []uint64) ([]uint64, uint64) {
				fi, _ := os.Stat(filepath.Join(dir, segName(f[2])))
				keep := f[2]
				for off := int64(headerSize); off+frameHeader+int64(len(rec(keep))) <= fi.Size()/2; keep++ {
					off += frameHeader + int64(len(rec(keep)))
				}
				return append(seqs(1, keep-1), seqs(f[3], n)...), f[3] - keep
			},
			quarantined: 1,
		},
		"sealed segment missing (gap)": {
			damage: func(t *testing.T, dir string) { os.Remove(segments(t, dir)[1]) },
			want: func(_ string, f []uint64) ([]uint64, uint64) {
				return append(seqs(1, f[1]-1), seqs(f[2], n)...), f[2] - f[1]
			},
		},
		"foreign and temporary files": {
			damage: func(t *testing.T, dir string) {
				os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("hello"), 0o600)
				os.WriteFile(filepath.Join(dir, "meta.tmp"), []byte("half"), 0o600)
			},
			want: all,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			fill(t, dir, n, segBytes)
			var firsts []uint64
			for _, s := range segments(t, dir) {
				f, _ := parseSegName(filepath.Base(s))
				firsts = append(firsts, f)
			}
			want, lost := tc.want(dir, firsts)
			tc.damage(t, dir)
			l, err := Open(dir, Options{SegmentBytes: segBytes})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer l.Close()
			got := readAll(t, l, 1)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("survivors:\n got %v\nwant %v", got, want)
			}
			st := l.Stats()
			if tc.truncated == -1 && st.Truncated <= 0 || tc.truncated >= 0 && st.Truncated != tc.truncated {
				t.Errorf("truncated %d bytes, want %d", st.Truncated, tc.truncated)
			}
			if st.Quarantined != tc.quarantined || st.Lost != lost {
				t.Errorf("quarantined %d lost %d, want %d and %d", st.Quarantined, st.Lost, tc.quarantined, lost)
			}
			if q, _ := filepath.Glob(filepath.Join(dir, "quarantine", "*.seg")); len(q) != tc.quarantined {
				t.Errorf("quarantine holds %v", q)
			}
			// The log goes on: the next record follows the last valid one
			// (or, with the active segment's header gone, starts it again).
			wantNext := uint64(n + 1)
			if want[len(want)-1] < n {
				wantNext = want[len(want)-1] + 1
			}
			seq, err := l.Append(rec(wantNext))
			if err != nil || seq != wantNext {
				t.Fatalf("Append after recovery = %d, %v; want %d", seq, err, wantNext)
			}
			if _, err := os.Stat(filepath.Join(dir, "meta.tmp")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("meta.tmp left behind")
			}
		})
	}
}

func TestPositionAndDrop(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 300, 2048)
	l, err := Open(dir, Options{SegmentBytes: 2048})
	if err != nil {
		t.Fatal(err)
	}
	if p := l.Position(); p != 0 {
		t.Errorf("position without meta = %d", p)
	}
	if err := l.SetPosition(150); err != nil {
		t.Fatal(err)
	}
	before := l.Stats()
	if err := l.DropBefore(150); err != nil {
		t.Fatal(err)
	}
	after := l.Stats()
	if after.First > 150 || after.First <= 1 || after.Bytes >= before.Bytes || after.Segments >= before.Segments {
		t.Errorf("drop: before %+v after %+v", before, after)
	}
	l.Close()
	l, err = Open(dir, Options{SegmentBytes: 2048})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := l.Position(); p != 150 {
		t.Errorf("position after reopen = %d", p)
	}
	got := readAll(t, l, l.Position())
	if fmt.Sprint(got) != fmt.Sprint(seqs(150, 300)) {
		t.Errorf("from position: %v", got)
	}
	// A corrupted meta means position 0: deliver again, never lose.
	os.WriteFile(filepath.Join(dir, "meta"), []byte("garbage-garbage-garbage"), 0o600)
	if p := l.Position(); p != 0 {
		t.Errorf("corrupt meta position = %d", p)
	}
}

func TestMaxBytes(t *testing.T) {
	l, err := Open(t.TempDir(), Options{MaxBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := 0
	for {
		if _, err := l.Append(make([]byte, 100)); err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			break
		}
		n++
	}
	// 8-byte header + n frames of 116 bytes <= 1000
	if want := (1000 - headerSize) / 116; n != want {
		t.Errorf("%d records fit, want %d", n, want)
	}
}

func TestDropFirstUnderAReader(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 300, 2048)
	l, err := Open(dir, Options{SegmentBytes: 2048})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := l.NewReader(1)
	defer r.Close()
	if seq, _, err := r.Next(); seq != 1 || err != nil {
		t.Fatalf("Next = %d %v", seq, err)
	}
	segs := segments(t, dir)
	second, _ := parseSegName(filepath.Base(segs[1]))
	n, err := l.DropFirst()
	if err != nil || n != second-1 {
		t.Fatalf("DropFirst = %d, %v; want %d", n, err, second-1)
	}
	// The reader was inside the dropped segment: it continues at the first
	// record still on disk.
	if seq, _, err := r.Next(); seq != second || err != nil {
		t.Fatalf("after drop Next = %d %v, want %d", seq, err, second)
	}
}
