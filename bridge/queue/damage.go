package queue

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// Damage inside a segment (a flipped bit, a bad sector, a torn page) is
// confined to the frames it hits. The frames after it carry their own
// sequence numbers and checksums, so a reader that meets an invalid frame
// looks for the next valid one; if there is one, only the records between
// are lost (a hole), and if there is none the rest of the segment is a
// damaged tail. A damaged segment is copied to quarantine/ once, for
// inspection; the original stays where readers expect it, so a second
// reader (or a restart) finds the same records the first did.

// hole is a damaged region of a segment: the frame expected at its start
// offset is unreadable, and reading resumes at offset to, whose frame
// carries sequence number seq.
type hole struct {
	to  int64
	seq uint64
}

// maxQuarantined bounds the copies kept in quarantine/ (at most 16 MiB
// each): damage is rare, and a failing card must not fill the disk with
// copies of itself.
const maxQuarantined = 8

// maxSkip bounds how far ahead a frame found while resynchronising may
// be: a frame whose sequence number jumps further cannot belong here.
const maxSkip = 1 << 24

// resync finds the first valid frame in b whose sequence number is at
// least from (the frame at the start of b counts: it may be valid and
// merely ahead). b was read from offset base, which is never a segment's
// header.
func resync(b []byte, base int64, from uint64) (off int64, seq uint64, ok bool) {
	for p := 0; p+frameHeader <= len(b); p++ {
		l := binary.LittleEndian.Uint32(b[p:])
		if l == 0 || l > maxPayload || p+frameHeader+int(l) > len(b) {
			continue
		}
		s := binary.LittleEndian.Uint64(b[p+8:])
		if s < from || s-from > maxSkip {
			continue
		}
		if crc32.Update(0, castagnoli, b[p+8:p+frameHeader+int(l)]) != binary.LittleEndian.Uint32(b[p+4:]) {
			continue
		}
		return base + int64(p), s, true
	}
	return 0, 0, false
}

// neverWritten reports whether a damaged region looks like space the
// file was extended over but whose writes never reached the disk: after a
// power cut, unsynced writes land in any order, and a later one may have
// made it while an earlier one did not, which then reads back as zeros.
// Such a region starts where a frame was expected and found none (an
// all-zero frame header), or ends, where the next valid frame begins, in
// zeros (a torn write followed by the gap). A flipped bit or a bad sector
// in written frames looks like neither.
//
// What follows a never-written region was not synced either (a sync
// covers everything before it), so it was never acknowledged: it is a
// damaged tail, not a hole. Keeping it would report records stored that
// come after one that is not.
func neverWritten(region []byte) bool {
	const zeroTail = 16
	if len(region) < frameHeader {
		return false
	}
	return allZero(region[:frameHeader]) || len(region) >= zeroTail && allZero(region[len(region)-zeroTail:])
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// copyToQuarantine keeps a copy of a damaged segment in quarantine/, once.
// The caller holds l.mu.
func (l *Log) copyToQuarantine(s *segment) {
	if s.copied {
		return
	}
	s.copied = true
	l.stats.Quarantined++
	qdir := filepath.Join(l.dir, "quarantine")
	err := func() error {
		if err := MkdirDurable(qdir); err != nil {
			return err
		}
		if kept, _ := os.ReadDir(qdir); len(kept) >= maxQuarantined {
			return fmt.Errorf("quarantine/ already holds %d copies; not copied", len(kept))
		}
		src, err := os.Open(s.path)
		if err != nil {
			return err
		}
		defer src.Close()
		dst, err := os.OpenFile(filepath.Join(qdir, filepath.Base(s.path)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
		if err != nil {
			return err
		}
		if _, err := io.Copy(dst, src); err != nil {
			dst.Close()
			return err
		}
		if err := dst.Sync(); err != nil {
			dst.Close()
			return err
		}
		if err := dst.Close(); err != nil {
			return err
		}
		return syncDir(qdir)
	}()
	if err != nil {
		l.log.Error("queue: cannot copy damaged segment to quarantine", "segment", s.path, "err", err)
	}
}

// segmentOf returns the segment whose first record is first, and the one
// after it (nil for the active segment). The caller holds l.mu.
func (l *Log) segmentOf(first uint64) (cur, next *segment) {
	for i, s := range l.segs {
		if s.first == first {
			if i+1 < len(l.segs) {
				next = l.segs[i+1]
			}
			return s, next
		}
	}
	return nil, nil
}

// skip handles an invalid frame met by a reader at off, where record
// expect was due, in the segment starting at first: it returns where
// reading resumes. found is false when nothing valid follows in the
// segment (a damaged tail); a sealed segment is then cut there, once, so
// that every later reader ends it cleanly. Records lost are counted once,
// however many readers pass.
func (l *Log) skip(f *os.File, first uint64, off int64, expect uint64, why error) (h hole, found bool, err error) {
	l.mu.Lock()
	s, next := l.segmentOf(first)
	if s == nil {
		l.mu.Unlock()
		return hole{}, false, nil // dropped meanwhile
	}
	if h, ok := s.holes[off]; ok {
		l.mu.Unlock()
		return h, true, nil
	}
	if s.cut > 0 && off >= s.cut {
		l.mu.Unlock()
		return hole{}, false, nil
	}
	l.mu.Unlock()

	rest, err := readFrom(f, off)
	if err != nil {
		return hole{}, false, fmt.Errorf("read segment %s: %w", s.path, err)
	}
	from := off
	if off == 0 && len(rest) > 0 { // the damaged header: frames start after its first byte
		rest, from = rest[1:], 1
	}
	to, seq, ok := resync(rest, from, expect)
	if ok && neverWritten(rest[:to-from]) {
		ok = false // the tail of a power cut: see neverWritten
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.copyToQuarantine(s)
	if ok {
		h = hole{to: to, seq: seq}
		if s.holes == nil {
			s.holes = map[int64]hole{}
		}
		s.holes[off] = h
		l.stats.Lost += seq - expect
		l.log.Error("queue: damaged records skipped", "segment", s.path, "offset", off, "records_lost", seq-expect, "reason", why)
		return h, true, nil
	}
	if next == nil {
		return hole{}, false, nil // the active segment: its tail is the writer's
	}
	// A damaged tail of a sealed segment: cut it, so the valid prefix reads
	// cleanly ever after.
	if err := os.Truncate(s.path, off); err != nil {
		l.log.Error("queue: cannot cut damaged tail of segment", "segment", s.path, "err", err)
	} else if cf, err := os.OpenFile(s.path, os.O_RDWR, 0); err == nil {
		cf.Sync()
		cf.Close()
	}
	l.bytes -= s.size - off
	s.size, s.cut = off, off
	s.tailLost = true
	l.stats.Lost += next.first - expect
	l.log.Error("queue: damaged tail of a sealed segment cut", "segment", s.path, "offset", off,
		"records_lost", next.first-expect, "reason", why)
	return hole{}, false, nil
}

// readFrom reads f from off to its end.
func readFrom(f *os.File, off int64) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() <= off {
		return nil, nil
	}
	b := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(b, off)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return b[:n], nil
}
