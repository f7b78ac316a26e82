package queue

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// Reader reads durable records in sequence order. It is not safe for
// concurrent use; a Log may have many Readers.
type Reader struct {
	l      *Log
	seq    uint64 // next record wanted
	f      *os.File
	br     *bufio.Reader
	first  uint64 // first record of the open segment
	expect uint64 // sequence number of the next frame in the open segment
	off    int64
	hdr    [frameHeader]byte
	// badHeader: the open segment's header is damaged; the next readFrame
	// reports it as damage at offset 0.
	badHeader bool
	buf       []byte
}

// NewReader returns a reader positioned at seq (or at the first record on
// disk, if seq was dropped).
func (l *Log) NewReader(seq uint64) *Reader {
	return &Reader{l: l, seq: seq}
}

// Close releases the reader's file.
func (r *Reader) Close() error {
	if r.f != nil {
		err := r.f.Close()
		r.f = nil
		return err
	}
	return nil
}

// Next returns the next durable record. The payload is valid until the next
// call. It returns io.EOF when no more durable records exist yet; call again
// later for new ones. Damaged frames are skipped and counted (see damage.go).
func (r *Reader) Next() (uint64, []byte, error) {
	for {
		l := r.l
		l.mu.Lock()
		if err := l.usable(); err != nil {
			l.mu.Unlock()
			return 0, nil, err
		}
		durable := l.durable
		var cur, next *segment
		if r.f == nil {
			if r.seq < l.segs[0].first {
				r.seq = l.segs[0].first // dropped before we got here
			}
			for i, s := range l.segs {
				if s.first <= r.seq {
					cur = s
					if i+1 < len(l.segs) {
						next = l.segs[i+1]
					}
				}
			}
		} else {
			found := false
			for i, s := range l.segs {
				if s.first == r.first {
					found = true
					if i+1 < len(l.segs) {
						next = l.segs[i+1]
					}
				}
			}
			if !found { // dropped under us: start again from the first on disk
				l.mu.Unlock()
				r.Close()
				continue
			}
		}
		l.mu.Unlock()

		if r.f == nil {
			if cur == nil || r.seq >= durable {
				return 0, nil, io.EOF
			}
			if err := r.open(cur); err != nil {
				return 0, nil, fmt.Errorf("read queue segment %s: %w", segName(cur.first), err)
			}
		}
		if r.expect >= durable {
			return 0, nil, io.EOF
		}
		payload, err := r.readFrame()
		if errors.Is(err, io.EOF) && next != nil {
			// End of a sealed segment: on to the next.
			r.Close()
			l.mu.Lock()
			cur, _ := l.segmentOf(r.first)
			counted := cur != nil && cur.tailLost
			if next.first != r.expect && !counted {
				l.stats.Lost += next.first - r.expect
			}
			l.mu.Unlock()
			if next.first != r.expect && !counted {
				l.log.Error("queue: gap between segments", "expected", r.expect, "next", next.first)
			}
			r.seq = max(r.seq, next.first)
			continue
		}
		var fe *FrameError
		if errors.As(err, &fe) {
			h, found, serr := l.skip(r.f, r.first, r.off, r.expect, err)
			if serr != nil {
				return 0, nil, serr
			}
			if found {
				if _, err := r.f.Seek(h.to, io.SeekStart); err != nil {
					return 0, nil, fmt.Errorf("read queue segment %s: %w", segName(r.first), err)
				}
				r.br.Reset(r.f)
				r.off, r.expect = h.to, h.seq
				continue
			}
			if next != nil {
				r.Close()
				r.seq = max(r.seq, next.first)
				continue
			}
		}
		if err != nil {
			// An I/O error, or damage in the active segment after Open:
			// nothing is set aside on an error that may pass.
			return 0, nil, fmt.Errorf("read queue segment %s: %w", segName(r.first), err)
		}
		seq := r.expect
		r.expect++
		if seq < r.seq {
			continue
		}
		r.seq = seq + 1
		return seq, payload, nil
	}
}

// open opens segment s for reading at its first frame. A damaged header
// is not an error here: the reader is left at offset 0 with the header
// unread, and the first frame read there is invalid, like any damage.
func (r *Reader) open(s *segment) error {
	f, err := os.Open(s.path)
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(f, 64<<10)
	h := make([]byte, headerSize)
	r.f, r.br, r.first, r.expect = f, br, s.first, s.first
	if _, err := io.ReadFull(br, h); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		r.Close()
		return err
	}
	if !validHeader(h) {
		r.off = 0
		r.badHeader = true
		return nil
	}
	r.off = headerSize
	return nil
}

// readFrame reads and checks the next frame. io.EOF means a clean end of
// the segment.
func (r *Reader) readFrame() ([]byte, error) {
	if r.badHeader {
		r.badHeader = false
		return nil, &FrameError{0, "bad segment header"}
	}
	if _, err := io.ReadFull(r.br, r.hdr[:4]); err != nil {
		switch {
		case err == io.EOF:
			return nil, io.EOF
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, &FrameError{r.off, "torn header"}
		}
		return nil, err
	}
	n := int(uint32(r.hdr[0]) | uint32(r.hdr[1])<<8 | uint32(r.hdr[2])<<16 | uint32(r.hdr[3])<<24)
	if n == 0 || n > maxPayload {
		return nil, &FrameError{r.off, fmt.Sprintf("bad length %d", n)}
	}
	if cap(r.buf) < frameHeader+n {
		r.buf = make([]byte, frameHeader+n)
	}
	b := r.buf[:frameHeader+n]
	copy(b, r.hdr[:4])
	if _, err := io.ReadFull(r.br, b[4:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &FrameError{r.off, "torn frame"}
		}
		return nil, err
	}
	payload, size, err := parseFrame(b, r.off, r.expect)
	if err != nil {
		return nil, err
	}
	r.off += int64(size)
	return payload, nil
}
