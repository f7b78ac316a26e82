// Package queue is a crash-safe, segmented, append-only log of opaque
// records numbered by sequence. It knows bytes and positions, nothing of
// MQTT or Kafka. FORMAT.md beside this file documents the on-disk format
// and the recovery rules.
//
// Append writes records; Sync makes them durable; readers see only durable
// records; a writer that wants group commit batches its own appends (the
// gateway's ingest journal does, in gateway/journal). A failed fsync fails
// the log for good.
package queue

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ErrFull is returned by Append when the log would exceed Options.MaxBytes.
var ErrFull = errors.New("queue: full (max_bytes reached)")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("queue: closed")

// Options configures a Log.
type Options struct {
	SegmentBytes int64 // roll to a new segment beyond this size; default 16 MiB
	MaxBytes     int64 // refuse appends beyond this total size; 0 means no limit
	Logger       *slog.Logger
}

// Stats describes the log and what recovery found.
type Stats struct {
	First       uint64 // first record still on disk (== Next when empty)
	Next        uint64 // sequence number the next record will get
	Durable     uint64 // records below this are durable
	Bytes       int64  // total size of the segments
	Segments    int
	Truncated   int64  // bytes cut from the tail at Open (torn or corrupt)
	Quarantined int    // damaged segments copied to quarantine/
	Lost        uint64 // records in damaged frames or gaps
	Syncs       uint64 // successful Sync calls
}

type segment struct {
	first uint64
	path  string
	size  int64

	// What readers found damaged (damage.go), under Log.mu.
	holes    map[int64]hole // offset of an invalid frame → where reading resumes
	cut      int64          // a damaged tail was cut at this offset (0: none)
	tailLost bool           // the records after the cut are counted lost
	copied   bool           // a copy is in quarantine/
}

// Log is a segmented append-only log in one directory. Its methods are safe
// for concurrent use.
type Log struct {
	dir  string
	id   string
	opts Options
	log  *slog.Logger

	syncMu   sync.Mutex // one Sync at a time: a second must not return before the first's fsyncs
	mu       sync.Mutex
	segs     []*segment // sorted by first; the last is active
	active   *os.File
	next     uint64
	durable  uint64
	bytes    int64
	unsynced []*os.File // sealed since the last Sync; synced and closed by it
	dirDirty bool
	failed   error
	closed   bool
	stats    Stats
}

func segName(first uint64) string { return fmt.Sprintf("%020d.seg", first) }

func parseSegName(name string) (uint64, bool) {
	s, ok := strings.CutSuffix(name, ".seg")
	if !ok || len(s) != 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && n > 0
}

// Open opens or creates the log in dir and recovers it as FORMAT.md says.
func Open(dir string, opts Options) (*Log, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = 16 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := MkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	l := &Log{dir: dir, opts: opts, log: opts.Logger}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(dir, name))
			continue
		}
		first, ok := parseSegName(name)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("open queue %s: %w", dir, err)
		}
		l.segs = append(l.segs, &segment{first: first, path: filepath.Join(dir, name), size: info.Size()})
	}
	sort.Slice(l.segs, func(i, j int) bool { return l.segs[i].first < l.segs[j].first })
	if len(l.segs) == 0 {
		if err := l.createSegment(1); err != nil {
			return nil, err
		}
		if err := syncDir(dir); err != nil {
			return nil, err
		}
	} else if err := l.recoverActive(); err != nil {
		return nil, err
	}
	for _, s := range l.segs {
		l.bytes += s.size
	}
	l.durable = l.next
	if l.id, err = loadID(dir); err != nil {
		l.active.Close()
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	return l, nil
}

// recoverActive scans the last segment: damaged frames followed by valid
// ones are skipped (a hole, counted), a damaged tail is truncated after the
// last valid frame. The segment is then sealed and a new one started, so
// that nothing is ever appended to a file whose pages were read back from
// the page cache: after a failed fsync (the process then exits) those pages
// may never reach the disk, and appending after them would put acknowledged
// records behind data that is not there.
func (l *Log) recoverActive() error {
	s := l.segs[len(l.segs)-1]
	rf, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("recover segment %s: %w", s.path, err)
	}
	defer rf.Close()
	fi, err := rf.Stat()
	if err != nil {
		return fmt.Errorf("recover segment %s: %w", s.path, err)
	}
	size := fi.Size()
	// The valid prefix is streamed, a frame at a time, so that recovery
	// needs no more memory than the largest record; only what follows an
	// invalid frame is read whole, to look for valid frames after it.
	valid, seq, off := int64(0), s.first, int64(0)
	br := bufio.NewReaderSize(rf, 64<<10)
	hdr := make([]byte, headerSize)
	if _, err := io.ReadFull(br, hdr); err == nil && validHeader(hdr) {
		valid, off = headerSize, headerSize
		var buf []byte
		for {
			h, err := br.Peek(frameHeader)
			if err != nil {
				break
			}
			n := int(binary.LittleEndian.Uint32(h))
			if n == 0 || n > maxPayload || off+int64(frameHeader+n) > size {
				break
			}
			if cap(buf) < frameHeader+n {
				buf = make([]byte, frameHeader+n)
			}
			b := buf[:frameHeader+n]
			if _, err := io.ReadFull(br, b); err != nil {
				break
			}
			if _, _, err := parseFrame(b, off, seq); err != nil {
				break
			}
			off += int64(frameHeader + n)
			valid, seq = off, seq+1
		}
	}
	base := off
	data, err := readFrom(rf, base)
	if err != nil {
		return fmt.Errorf("recover segment %s: %w", s.path, err)
	}
	damaged := false
	for off < base+int64(len(data)) {
		if off > 0 { // not the damaged header itself
			if _, n, err := parseFrame(data[off-base:], off, seq); err == nil {
				off += int64(n)
				valid, seq = off, seq+1
				continue
			}
		}
		from := off
		if off == 0 { // the damaged header: frames start after its first byte
			from = 1
		}
		to, next, ok := resync(data[from-base:], from, seq)
		if !ok {
			break
		}
		if neverWritten(data[off-base : to-base]) {
			// Unsynced writes that landed out of order after a power cut:
			// the rest is a torn tail (see neverWritten).
			l.log.Warn("queue: unsynced tail dropped: a never-written gap, then frames that landed after it (power loss)",
				"segment", s.path, "offset", off, "frames_resume_at", to)
			break
		}
		if s.holes == nil {
			s.holes = map[int64]hole{}
		}
		s.holes[off] = hole{to: to, seq: next}
		l.stats.Lost += next - seq
		l.log.Error("queue: damaged records skipped", "segment", s.path, "offset", off, "records_lost", next-seq)
		damaged = true
		off, seq = to, next
	}
	if valid < headerSize && seq > s.first {
		valid = off // a damaged header with valid frames after it
	}
	if damaged || valid < headerSize && size > 0 {
		l.copyToQuarantine(s)
	}
	f, err := os.OpenFile(s.path, os.O_RDWR, 0o640)
	if err != nil {
		return fmt.Errorf("recover segment %s: %w", s.path, err)
	}
	defer f.Close()
	if cut := size - valid; cut > 0 || valid == 0 {
		l.stats.Truncated += cut
		l.log.Warn("queue: damaged tail truncated", "segment", s.path, "bytes", cut, "valid_records", seq-s.first)
		if err := f.Truncate(valid); err != nil {
			return fmt.Errorf("truncate segment %s: %w", s.path, err)
		}
	}
	if valid < headerSize && seq == s.first {
		// Nothing valid at all: start the segment again, in place.
		if _, err := f.WriteAt(segmentHeader(), 0); err != nil {
			return fmt.Errorf("rewrite segment header %s: %w", s.path, err)
		}
		valid = headerSize
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync segment %s: %w", s.path, err)
	}
	s.size = valid
	if seq == s.first {
		// No records: the segment can be the active one again; its header
		// was just rewritten or fsynced.
		a, err := os.OpenFile(s.path, os.O_RDWR, 0o640)
		if err != nil {
			return fmt.Errorf("recover segment %s: %w", s.path, err)
		}
		if _, err := a.Seek(valid, io.SeekStart); err != nil {
			a.Close()
			return fmt.Errorf("seek segment %s: %w", s.path, err)
		}
		l.active, l.next = a, seq
		return nil
	}
	if err := l.createSegment(seq); err != nil {
		return err
	}
	return syncDir(l.dir)
}

// createSegment starts a new active segment whose first record is first.
func (l *Log) createSegment(first uint64) error {
	path := filepath.Join(l.dir, segName(first))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("create segment %s: %w", path, err)
	}
	if _, err := f.Write(segmentHeader()); err != nil {
		f.Close()
		return fmt.Errorf("write segment header %s: %w", path, err)
	}
	l.segs = append(l.segs, &segment{first: first, path: path, size: headerSize})
	l.active = f
	l.next = first
	l.dirDirty = true
	return nil
}

// Append writes records to the log and returns the sequence number of the
// first. They are durable after the next Sync. The whole batch is refused
// with ErrFull if it would take the log over MaxBytes.
func (l *Log) Append(records ...[]byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return 0, err
	}
	var total int64
	for _, r := range records {
		if len(r) == 0 || len(r) > maxPayload {
			if len(r) == 0 {
				return 0, errors.New("queue: empty record")
			}
			return 0, ErrTooLarge
		}
		total += frameSize(len(r))
	}
	if l.opts.MaxBytes > 0 && l.bytes+total > l.opts.MaxBytes {
		return 0, ErrFull
	}
	first := l.next
	buf := make([]byte, 0, min(total, l.opts.SegmentBytes))
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		if _, err := l.active.Write(buf); err != nil {
			l.failed = fmt.Errorf("append: %w", err) // err names the file
			return l.failed
		}
		l.segs[len(l.segs)-1].size += int64(len(buf))
		l.bytes += int64(len(buf))
		buf = buf[:0]
		return nil
	}
	for _, r := range records {
		act := l.segs[len(l.segs)-1]
		if act.size+int64(len(buf))+frameSize(len(r)) > l.opts.SegmentBytes && act.size+int64(len(buf)) > headerSize {
			if err := flush(); err != nil {
				return 0, err
			}
			l.unsynced = append(l.unsynced, l.active)
			if err := l.createSegment(l.next); err != nil {
				l.failed = err
				return 0, err
			}
			l.bytes += headerSize
		}
		buf = appendFrame(buf, l.next, r)
		l.next++
	}
	if err := flush(); err != nil {
		return 0, err
	}
	return first, nil
}

func (l *Log) usable() error {
	if l.closed {
		return ErrClosed
	}
	return l.failed
}

// testHookSyncing, when set by a test, runs in Sync between taking the
// files to fsync and fsyncing them.
var testHookSyncing func()

// Sync makes every record appended before it was called durable. A failure
// fails the log: the caller must not acknowledge anything it appended, and
// should stop the process.
func (l *Log) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	if err := l.usable(); err != nil {
		l.mu.Unlock()
		return err
	}
	files := append(l.unsynced, l.active)
	l.unsynced = nil
	dirDirty := l.dirDirty
	l.dirDirty = false
	upTo := l.next
	l.mu.Unlock()
	if testHookSyncing != nil {
		testHookSyncing()
	}

	var err error
	for i, f := range files {
		if e := f.Sync(); e != nil && err == nil {
			err = fmt.Errorf("fsync: %w", e) // e names the file
		}
		if i < len(files)-1 {
			f.Close() // sealed
		}
	}
	if err == nil && dirDirty {
		err = syncDir(l.dir)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed = err
		return err
	}
	if upTo > l.durable {
		l.durable = upTo
	}
	l.stats.Syncs++
	return nil
}

// DropBefore removes the sealed segments whose records are all below seq.
// The caller must already have made durable, elsewhere, the fact that those
// records are no longer needed.
func (l *Log) DropBefore(seq uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	n := 0
	for n < len(l.segs)-1 && l.segs[n+1].first <= seq {
		n++
	}
	if n == 0 {
		return nil
	}
	for _, s := range l.segs[:n] {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove segment %s: %w", s.path, err)
		}
		l.bytes -= s.size
	}
	l.segs = append(l.segs[:0], l.segs[n:]...)
	return syncDir(l.dir)
}

// DropFirst removes the oldest sealed segment, whatever has been read of it,
// to make room (a drop-oldest policy). It returns how many records went; 0
// when only the active segment is left.
func (l *Log) DropFirst() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return 0, err
	}
	if len(l.segs) < 2 {
		return 0, nil
	}
	s := l.segs[0]
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("remove segment %s: %w", s.path, err)
	}
	l.bytes -= s.size
	n := l.segs[1].first - s.first
	l.segs = l.segs[1:]
	return n, syncDir(l.dir)
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.First = l.segs[0].first
	s.Next = l.next
	s.Durable = l.durable
	s.Bytes = l.bytes
	s.Segments = len(l.segs)
	return s
}

// Close syncs and closes the log.
func (l *Log) Close() error {
	err := l.Sync()
	if errors.Is(err, ErrClosed) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if cerr := l.active.Close(); err == nil {
		err = cerr
	}
	return err
}

// MkdirDurable creates dir (and its parents) if it does not exist, and
// makes the new entries durable: after a power cut a directory created
// without an fsync of its parent may be gone, with everything in it.
func MkdirDurable(dir string) error {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	for _, d := range created {
		if err := syncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// SyncDir makes the entries of dir durable (an fsync of the directory):
// after creating, renaming or removing a file in it.
func SyncDir(dir string) error { return syncDir(dir) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
