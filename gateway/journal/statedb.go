package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge/queue"
)

// StateDB is the gateway's state on disk, <data_dir>/state/state.db (a
// bbolt B+tree file): the latest checkpoint and the closed windows kept
// for late revisions. Both change in one transaction per checkpoint, so
// they always describe the same moment of the journal. Between
// checkpoints nothing is written; the aggregator reads windows it does not
// hold in RAM (Load).
//
// Before each checkpoint replaces the one in the file, that one is copied
// to <data_dir>/state/checkpoint.prev (written whole, fsynced, renamed):
// two checkpoints, each with its own checksum, in two files. The gateway
// keeps the journal back to the older one, so that if the newer one, or
// the whole state file, is damaged, the older one and the journal rebuild
// the same state (OpenStateDB).
type StateDB struct {
	db       *bolt.DB
	Path     string
	prevPath string
	log      *slog.Logger

	hasCP       bool  // the file holds a checkpoint
	prevCurrent bool  // checkpoint.prev holds the file's checkpoint already
	lostBefore  int64 // windows starting before this were lost if not found (math.MinInt64: none)
	ahead       aheadMark
	position    func() uint64
	recovery    Recovery
}

// aheadMark says that the file's checkpoint (from) is older than some of
// its windows, written by checkpoints up to until: the state was rebuilt
// from an older checkpoint than the newest, whose windows were kept. Such
// a window already holds the journal's events up to its own checkpoint, so
// while the replay has not reached that one, Load must not hand it out (it
// would count those events twice); after, it is exactly right. The mark is
// removed by the first commit after the replay.
type aheadMark struct {
	set         bool
	from, until uint64
}

var (
	bucketMeta    = []byte("meta")
	bucketWindows = []byte("windows")
	keyCheckpoint = []byte("checkpoint")
	keyLost       = []byte("lost_before")
	keyAhead      = []byte("ahead")
)

// PreviousName is the file, beside state.db, holding the checkpoint before
// the one in state.db.
const PreviousName = "checkpoint.prev"

// maxQuarantinedState bounds the damaged state files (and previous
// checkpoints) kept in the quarantine directory: a state file may be
// large, and a failing card must not fill the disk with copies of it.
const maxQuarantinedState = 4

// rebuildBatch is how many windows one transaction of a rebuild writes:
// bbolt holds a transaction's pages in RAM until it commits.
const rebuildBatch = 20_000

// StateOptions configures OpenStateDB.
type StateOptions struct {
	Log *slog.Logger
	// Quarantine is the directory where a damaged state file, or a
	// damaged previous checkpoint, is kept for inspection
	// (<data_dir>/quarantine); "" keeps none.
	Quarantine string
	// Position returns the journal sequence being applied (the replay's
	// position). It is called from Load, by the aggregator, so in the
	// caller's goroutine; nil is never behind.
	Position func() uint64
}

// Recovery is what OpenStateDB found wrong with the state file and the
// previous checkpoint, and what it did about it.
type Recovery struct {
	// Damage says what was wrong ("": nothing).
	Damage string
	// Quarantined lists the damaged files kept for inspection.
	Quarantined []string
	// Rebuilt is set when state.db was written anew from what could be
	// read (and, when damaged, the old one set aside).
	Rebuilt bool
	// From names the checkpoint the state now starts from: "state.db",
	// "state.db (previous transaction)", PreviousName, or "" when there is
	// none and the journal alone rebuilds the state. Seq is its journal
	// sequence.
	From string
	Seq  uint64
	// WindowsKept counts the closed windows carried into a rebuilt file,
	// WindowsAhead those of them written by a checkpoint newer than the
	// one in use (refused to the replay until it reaches that checkpoint),
	// WindowsDropped those that failed their checksum, DamagedPages the
	// subtrees of windows that could not be read.
	WindowsKept, WindowsAhead, WindowsDropped, DamagedPages int
	// WindowsLost is set when closed windows stored before the checkpoint
	// in use (or before the journal's start, without one) may be missing.
	WindowsLost bool
}

func (r Recovery) String() string {
	if !r.Rebuilt && r.Damage == "" {
		return ""
	}
	from := "no checkpoint (the journal alone)"
	if r.From != "" {
		from = fmt.Sprintf("checkpoint %d from %s", r.Seq, r.From)
	}
	s := fmt.Sprintf("%s; state from %s; %d closed windows kept (%d newer than the checkpoint), %d dropped, %d damaged pages of windows",
		r.Damage, from, r.WindowsKept, r.WindowsAhead, r.WindowsDropped, r.DamagedPages)
	if len(r.Quarantined) > 0 {
		s += "; damaged files kept in " + strings.Join(r.Quarantined, ", ")
	}
	return s
}

func (r *Recovery) damage(format string, args ...any) {
	if r.Damage != "" {
		r.Damage += "; "
	}
	r.Damage += fmt.Sprintf(format, args...)
}

func boltOptions(f *os.File) *bolt.Options {
	return &bolt.Options{Timeout: 2 * time.Second, FreelistType: bolt.FreelistMapType, NoFreelistSync: true,
		OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil }}
}

// OpenStateDB opens (or creates) the state file, after checking it (see
// statecheck.go) so that a damaged page can neither crash bbolt nor be read
// as true. The gateway never refuses to start because of its own files:
//
//   - A sound file is used as it is.
//   - Otherwise the damaged file is kept in opts.Quarantine and state.db is
//     rebuilt from the best consistent state that can still be read: bbolt
//     keeps the tree of its previous transaction beside the current one, so
//     a page written by the last checkpoint that is damaged still leaves
//     the one before whole; else the newest intact checkpoint (the file's,
//     or checkpoint.prev) with the closed windows that can be read (those
//     written by a newer checkpoint are refused to the replay until it
//     reaches that one: aheadMark); else no checkpoint at all.
//
// Recovery says what was found and done. Only I/O errors, and another
// process holding the file, are errors.
func OpenStateDB(path string, opts StateOptions) (*StateDB, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Dir(path)
	s := &StateDB{Path: path, prevPath: filepath.Join(dir, PreviousName), log: log, lostBefore: math.MinInt64, position: opts.Position}
	f, err := openLocked(path, 2*time.Second)
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("open state %s: locked by another process (is another edgegate running on this data_dir?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	// Leftovers of a rebuild or a previous checkpoint's write that a
	// crash interrupted: never renamed into place, so never used. (Only
	// the lock's holder may remove them.)
	for _, stale := range []string{path + ".rebuild", s.prevPath + ".tmp"} {
		if err := os.Remove(stale); err != nil && !errors.Is(err, os.ErrNotExist) {
			f.Close()
			return nil, fmt.Errorf("open state %s: %w", path, err)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	rec := &s.recovery
	prev, err := readPrevious(s.prevPath)
	if err != nil {
		var perr *prevDamage
		if !errors.As(err, &perr) {
			f.Close()
			return nil, fmt.Errorf("open state %s: %w", path, err)
		}
		rec.damage("%s unusable (%v)", PreviousName, perr.err)
		s.quarantine(s.prevPath, opts.Quarantine, rec)
		if err := os.Remove(s.prevPath); err != nil {
			f.Close()
			return nil, fmt.Errorf("open state %s: remove damaged %s: %w", path, PreviousName, err)
		}
		if err := syncDir(dir); err != nil {
			f.Close()
			return nil, fmt.Errorf("open state %s: %w", path, err)
		}
	}
	p := planState(f, fi.Size(), prev, rec)
	if p.inPlace {
		err = s.openInPlace(f, p, prev)
	} else {
		err = s.rebuild(f, p, prev, opts.Quarantine)
	}
	if err != nil {
		return nil, err
	}
	// A new (or rebuilt) state file's directory entry is durable only
	// once its directory is.
	if err := syncDir(dir); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	return s, nil
}

// openLocked opens path for reading and writing (creating it), and takes
// bbolt's exclusive lock on it, waiting up to timeout: the lock is taken
// before the file is inspected, and the same descriptor is then handed to
// bbolt (Options.OpenFile), so no other process can write it in between.
func openLocked(path string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			f.Close()
			if err == syscall.EWOULDBLOCK {
				return nil, errLocked
			}
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errLocked = errors.New("locked by another process")

// Recovery returns what OpenStateDB found and did.
func (s *StateDB) Recovery() Recovery { return s.recovery }

// Close closes the state file.
func (s *StateDB) Close() error { return s.db.Close() }

// statePlan is what to make of a state file.
type statePlan struct {
	inPlace bool // sound: open it as it is
	file    *boltFile
	source  int    // meta whose tree gives the windows (-1: none)
	cp      []byte // checkpoint to keep (nil: none)
	cpSeq   uint64
	from    string
	limit   uint64 // windows written by a checkpoint after this one are ahead of it
	lost    int64  // lost_before carried over
	ahead   aheadMark
	dropAll int // windows readable in the file, when none is kept
}

// treeSummary is what inspecting one tree found.
type treeSummary struct {
	meta       int
	walk       *treeWalk
	cp         []byte // a copy, when intact
	cpSeq      uint64
	cpErr      error
	hasCP      bool
	windows    int
	badWindows int
	lost       int64
	ahead      aheadMark
	unknown    []string
}

// clean reports a tree that can be used whole: nothing damaged. (Its
// windows may have been written after its checkpoint: a state rebuilt
// from an older checkpoint, or a journal replaced, which restarts the
// sequence.)
func (t *treeSummary) clean() bool {
	return t.walk.nprob == 0 && t.cpErr == nil && t.badWindows == 0 && len(t.unknown) == 0 && (t.hasCP || t.windows == 0)
}

func (t *treeSummary) problem() string {
	var p []string
	p = append(p, t.walk.problems...)
	if t.cpErr != nil {
		p = append(p, fmt.Sprintf("checkpoint: %v", t.cpErr))
	}
	if t.badWindows > 0 {
		p = append(p, fmt.Sprintf("%d windows fail their checksum", t.badWindows))
	}
	if len(t.unknown) > 0 {
		p = append(p, fmt.Sprintf("unexpected keys in meta: %q", t.unknown))
	}
	if !t.hasCP && t.windows > 0 {
		p = append(p, fmt.Sprintf("%d windows without a checkpoint", t.windows))
	}
	if more := t.walk.nprob - len(t.walk.problems); more > 0 {
		p = append(p, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(p, "; ")
}

func inspect(f *boltFile, meta int) *treeSummary {
	t := &treeSummary{meta: meta, lost: math.MinInt64}
	t.walk = f.walk(f.metas[meta], func(bucket, k, v []byte) {
		if string(bucket) == string(bucketWindows) {
			t.windows++
			if _, err := checkWindowState(k, v); err != nil {
				t.badWindows++
			}
			return
		}
		switch string(k) {
		case string(keyCheckpoint):
			t.hasCP = true
			if t.cpSeq, t.cpErr = checkpointSeq(v); t.cpErr == nil {
				t.cp = bytes.Clone(v)
			}
		case string(keyLost):
			if l, err := decodeLost(v); err == nil {
				t.lost = l
			} else {
				t.unknown = append(t.unknown, string(k)+" (damaged)")
			}
		case string(keyAhead):
			if a, err := decodeAhead(v); err == nil {
				t.ahead = a
			} else {
				t.unknown = append(t.unknown, string(k)+" (damaged)")
			}
		default:
			t.unknown = append(t.unknown, string(k))
		}
	})
	if t.walk.metaDamaged || t.walk.rootDamaged {
		// The meta bucket could not be read: its checkpoint is unknown.
		t.hasCP, t.cp, t.cpErr = true, nil, errors.New("in a damaged page")
	}
	return t
}

// planState inspects the state file f of size bytes and decides what to
// make of it (see OpenStateDB), recording damage in rec.
func planState(f io.ReaderAt, size int64, prev *prevCheckpoint, rec *Recovery) statePlan {
	none := statePlan{source: -1, lost: math.MinInt64}
	if size == 0 {
		if prev == nil {
			return statePlan{inPlace: true, source: -1, lost: math.MinInt64} // a new file
		}
		rec.damage("state file is empty or missing, but %s holds checkpoint %d", PreviousName, prev.seq)
		none.cp, none.cpSeq, none.from, none.limit = prev.data, prev.seq, PreviousName, prev.seq
		return none
	}
	bf := readBoltFile(f, size)
	none.file = bf
	var trees []*treeSummary
	if bf.cur < 0 {
		rec.damage("state file has no valid meta page (meta 0: %v; meta 1: %v)", bf.metas[0].err, bf.metas[1].err)
	} else {
		cur := inspect(bf, bf.cur)
		if cur.clean() {
			if cur.hasCP || prev == nil {
				return statePlan{inPlace: true, file: bf, source: bf.cur, cp: cur.cp, cpSeq: cur.cpSeq, from: "state.db", limit: cur.cpSeq,
					lost: cur.lost, ahead: cur.ahead}
			}
			rec.damage("state file holds no checkpoint, but %s holds checkpoint %d (was state.db replaced?)", PreviousName, prev.seq)
		} else {
			rec.damage("state file damaged: %s", cur.problem())
		}
		// Only now is the previous transaction's tree of interest.
		trees = append(trees, cur)
		if other := 1 - bf.cur; bf.metas[other].err == nil {
			trees = append(trees, inspect(bf, other))
		}
	}
	name := func(t *treeSummary) string {
		if t.meta == bf.cur {
			return "state.db"
		}
		return "state.db (previous transaction)"
	}
	p := none
	for _, t := range trees {
		p.lost = max(p.lost, t.lost)
	}
	// A whole tree, newest checkpoint first.
	var best *treeSummary
	for _, t := range trees {
		if t.clean() && t.hasCP && (best == nil || t.cpSeq > best.cpSeq) {
			best = t
		}
	}
	if best != nil {
		p.source, p.cp, p.cpSeq, p.from, p.limit = best.meta, best.cp, best.cpSeq, name(best), best.cpSeq
		return p
	}
	// Else the newest intact checkpoint, with the windows that can be read.
	for _, t := range trees {
		if t.cp != nil && (p.cp == nil || t.cpSeq > p.cpSeq) {
			p.source, p.cp, p.cpSeq, p.from, p.limit = t.meta, t.cp, t.cpSeq, name(t), t.cpSeq
		}
	}
	if prev != nil && (p.cp == nil || prev.seq > p.cpSeq) {
		p.cp, p.cpSeq, p.from, p.limit = prev.data, prev.seq, PreviousName, prev.seq
		// The windows of the newest tree that has some, unless it has no
		// checkpoint: then they are not checkpoint.prev's (state.db was
		// replaced).
		p.source = -1
		for _, t := range trees {
			if t.walk.buckets[string(bucketWindows)] {
				if t.hasCP {
					p.source = t.meta
				}
				break
			}
		}
	}
	if p.source < 0 && len(trees) > 0 {
		p.dropAll = trees[0].windows
	}
	for _, t := range trees {
		if t.meta == p.source && t.ahead.set && t.ahead.from == p.cpSeq {
			p.ahead = t.ahead // rebuilt again before the replay ended
		}
	}
	return p
}

// openInPlace opens the sound file f with bbolt.
func (s *StateDB) openInPlace(f *os.File, p statePlan, prev *prevCheckpoint) error {
	db, err := bolt.Open(s.Path, 0o640, boltOptions(f))
	if err != nil {
		return fmt.Errorf("open state %s: %w", s.Path, err) // bbolt closed f
	}
	s.db = db
	if p.file != nil {
		if m := p.file.metas[1-p.file.cur]; m.err != nil {
			// The usual trace of a power cut during a commit (its meta page
			// written last, torn), or damage to the newest meta: bbolt uses
			// the other, and so the state of the transaction before.
			s.log.Warn("state file: one meta page invalid; using the other", "file", s.Path, "err", m.err)
		}
	}
	if err := s.ensureBuckets(); err != nil {
		db.Close()
		return err
	}
	s.hasCP, s.lostBefore = p.cp != nil, p.lost
	if p.ahead.set && p.ahead.from == p.cpSeq {
		s.ahead = p.ahead
	}
	s.prevCurrent = prev != nil && p.cp != nil && bytes.Equal(prev.data, p.cp)
	if p.cp != nil {
		s.recovery.From, s.recovery.Seq = p.from, p.cpSeq
	}
	return nil
}

// ensureBuckets creates the buckets if they are missing (a new file), in
// a write transaction only then: a restart writes nothing.
func (s *StateDB) ensureBuckets() error {
	missing := false
	s.db.View(func(tx *bolt.Tx) error {
		missing = tx.Bucket(bucketMeta) == nil || tx.Bucket(bucketWindows) == nil
		return nil
	})
	if !missing {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketWindows} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("init state %s: %w", s.Path, err)
	}
	return nil
}

// rebuild writes a new state file from plan p, reading the old file old
// (which it closes): the damaged file is kept in quarantine, the new one
// written beside it, fsynced, then renamed over it. A crash before the
// rename leaves the old file, and the next start does it again.
func (s *StateDB) rebuild(old *os.File, p statePlan, prev *prevCheckpoint, quarantine string) error {
	rec := &s.recovery
	defer old.Close()
	if fi, err := old.Stat(); err == nil && fi.Size() > 0 {
		s.quarantine(s.Path, quarantine, rec)
	}
	tmp := s.Path + ".rebuild"
	nf, err := openLocked(tmp, 2*time.Second)
	if err != nil {
		return fmt.Errorf("rebuild state %s: %w", s.Path, err)
	}
	opts := boltOptions(nf)
	opts.NoSync = true // one fsync at the end: the file is not in use before the rename
	db, err := bolt.Open(tmp, 0o640, opts)
	if err != nil {
		return fmt.Errorf("rebuild state %s: %w", s.Path, err)
	}
	fail := func(err error) error {
		db.Close()
		os.Remove(tmp)
		return fmt.Errorf("rebuild state %s: %w", s.Path, err)
	}
	s.db = db
	if err := s.ensureBuckets(); err != nil {
		return fail(err)
	}
	var batch [][2][]byte
	flush := func() error {
		err := db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketWindows)
			for _, kv := range batch {
				if err := b.Put(kv[0], kv[1]); err != nil {
					return err
				}
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	var werr error
	ahead := p.ahead
	if p.source >= 0 {
		w := p.file.walk(p.file.metas[p.source], func(bucket, k, v []byte) {
			if string(bucket) != string(bucketWindows) || werr != nil {
				return
			}
			tag, err := checkWindowState(k, v)
			if err != nil {
				rec.WindowsDropped++
				return
			}
			if tag > p.limit {
				rec.WindowsAhead++
				ahead = aheadMark{set: true, from: p.limit, until: max(ahead.until, tag)}
			}
			rec.WindowsKept++
			batch = append(batch, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
			if len(batch) >= rebuildBatch {
				werr = flush()
			}
		})
		rec.DamagedPages = w.damaged
	}
	if werr == nil {
		werr = flush()
	}
	if werr != nil {
		return fail(werr)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if p.lost != math.MinInt64 {
			if err := b.Put(keyLost, encodeLost(p.lost)); err != nil {
				return err
			}
		}
		if ahead.set {
			if err := b.Put(keyAhead, encodeAhead(ahead)); err != nil {
				return err
			}
		}
		if p.cp != nil {
			return b.Put(keyCheckpoint, p.cp)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := db.Sync(); err != nil {
		return fail(err)
	}
	db.NoSync = false
	if err := os.Rename(tmp, s.Path); err != nil {
		return fail(err)
	}
	rec.Rebuilt = true
	rec.From, rec.Seq = p.from, p.cpSeq
	if p.source < 0 {
		rec.WindowsDropped = p.dropAll
	}
	rec.WindowsLost = p.source < 0 || rec.WindowsDropped > 0 || rec.DamagedPages > 0
	s.hasCP, s.lostBefore, s.ahead = p.cp != nil, p.lost, ahead
	s.prevCurrent = prev != nil && p.cp != nil && bytes.Equal(prev.data, p.cp)
	return nil
}

// quarantine keeps a damaged file in dir for inspection: a hard link
// (the file is about to be replaced, so this costs no space), or a copy
// where links are not possible. At most maxQuarantinedState are kept.
func (s *StateDB) quarantine(path, dir string, rec *Recovery) {
	if dir == "" {
		return
	}
	err := func() error {
		if err := queue.MkdirDurable(dir); err != nil {
			return err
		}
		kept, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		n := 0
		for _, e := range kept {
			if strings.HasPrefix(e.Name(), "state.db.") || strings.HasPrefix(e.Name(), PreviousName+".") {
				n++
			}
		}
		if n >= maxQuarantinedState {
			return fmt.Errorf("%s already holds %d damaged state files; not kept", dir, n)
		}
		dst := filepath.Join(dir, fmt.Sprintf("%s.%d", filepath.Base(path), time.Now().UnixNano()))
		if err := os.Link(path, dst); err != nil {
			if err := copyFile(path, dst); err != nil {
				return err
			}
		}
		rec.Quarantined = append(rec.Quarantined, dst)
		return syncDir(dir)
	}()
	if err != nil {
		s.log.Error("damaged state file not kept for inspection", "file", path, "err", err)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// prevCheckpoint is the content of checkpoint.prev.
type prevCheckpoint struct {
	data []byte
	seq  uint64
}

// prevDamage is a checkpoint.prev that exists but cannot be used.
type prevDamage struct{ err error }

func (e *prevDamage) Error() string { return e.err.Error() }

// readPrevious reads checkpoint.prev: nil if there is none, a *prevDamage
// if it fails its checksum.
func readPrevious(path string) (*prevCheckpoint, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	seq, err := checkpointSeq(b)
	if err != nil {
		return nil, &prevDamage{err}
	}
	return &prevCheckpoint{data: b, seq: seq}, nil
}

// writeFileDurable replaces path with data: written to path.tmp, fsynced,
// renamed, and the directory fsynced. A crash leaves the old file or the
// new one, never a part.
func writeFileDurable(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// Windows returns the number of closed windows stored.
func (s *StateDB) Windows() (int, error) {
	var n int
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketWindows).Stats().KeyN
		return nil
	})
	return n, err
}

// Checkpoint returns the stored checkpoint, nil if there is none.
func (s *StateDB) Checkpoint() ([]byte, error) {
	var b []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyCheckpoint); v != nil {
			b = append([]byte(nil), v...)
		}
		return nil
	})
	return b, err
}

// ClearWindows deletes every stored window (they no longer match the
// checkpoint being used).
func (s *StateDB) ClearWindows() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketWindows); err != nil {
			return err
		}
		_, err := tx.CreateBucket(bucketWindows)
		return err
	})
}

// MarkLost records that closed windows starting before before (Unix ns)
// may be missing from the file (it was damaged or lost): from then on Load
// reports such a window, when it does not find it, as an error rather
// than as never closed, so that a late reading is refused
// (late_state_evicted) instead of starting a revision 0 that would
// contradict the summaries sent.
func (s *StateDB) MarkLost(before int64) error {
	if before <= s.lostBefore {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyLost, encodeLost(before))
	})
	if err != nil {
		return fmt.Errorf("write state %s: %w", s.Path, err)
	}
	s.lostBefore = before
	return nil
}

// Commit writes a checkpoint (of journal sequence seq) with the
// aggregator's changed windows and deletes the windows past their horizon,
// in one transaction (fsynced). Before that, the checkpoint it replaces is
// written to checkpoint.prev (once).
func (s *StateDB) Commit(seq uint64, cp []byte, agg *aggregate.Aggregator) (written, deleted int, err error) {
	if err := s.keepPrevious(); err != nil {
		return 0, 0, err
	}
	defer func() {
		if r := recover(); r != nil { // a page damaged since the start; the next start repairs it
			err = fmt.Errorf("write state %s: %v", s.Path, r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketWindows)
		var perr error
		agg.TakeDirty(func(dev, metric string, w aggregate.WindowState) {
			// bbolt keeps key and value until the commit: no reuse.
			k := windowKey(nil, dev, metric, w.Start)
			if err := b.Put(k, appendWindowState(nil, k, seq, w)); err != nil && perr == nil {
				perr = err
			}
			written++
		})
		if perr != nil {
			return perr
		}
		// Keys are in time order, so the expired ones are at the front:
		// walk from the first key up to the latest horizon and delete
		// those before their own series' horizon. They are collected
		// first, as a bbolt cursor skips an entry when Next follows Delete.
		horizon := map[string]int64{}
		var latest int64 = math.MinInt64
		agg.Horizons(func(dev string, before int64) {
			horizon[string(appendString(nil, dev))] = before
			latest = max(latest, before)
		})
		var expired [][]byte
		c := b.Cursor()
		for k, _ := c.First(); len(k) > 8 && startOf(k) < latest; k, _ = c.Next() {
			if before, ok := horizon[string(deviceOf(k[8:]))]; ok && startOf(k) < before {
				expired = append(expired, append([]byte(nil), k...))
			}
		}
		for _, k := range expired {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		deleted = len(expired)
		m := tx.Bucket(bucketMeta)
		if err := m.Delete(keyAhead); err != nil { // the replay is over
			return err
		}
		return m.Put(keyCheckpoint, cp)
	})
	if err == nil {
		s.hasCP, s.prevCurrent, s.ahead = true, false, aheadMark{}
	}
	return written, deleted, err
}

// keepPrevious writes the file's checkpoint to checkpoint.prev, unless it
// is there already, before a commit replaces it.
func (s *StateDB) keepPrevious() error {
	if !s.hasCP || s.prevCurrent {
		return nil
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		return writeFileDurable(s.prevPath, tx.Bucket(bucketMeta).Get(keyCheckpoint))
	})
	if err != nil {
		return fmt.Errorf("keep previous checkpoint in %s: %w", s.prevPath, err)
	}
	s.prevCurrent = true
	return nil
}

var (
	errWindowLost  = errors.New("closed window lost with a damaged state file")
	errWindowAhead = errors.New("closed window stored by a checkpoint the replay has not reached")
)

// EndReplay says that the replay is over: from now on Load hands out
// every stored window (see aheadMark), even one written by a checkpoint
// beyond the end of the journal.
func (s *StateDB) EndReplay() { s.ahead = aheadMark{} }

// Load implements aggregate.Store. A panic or memory fault from a damaged
// page is turned into an error (the reading is then counted as
// late_state_evicted), as is a window that fails its checksum, that the
// replay may not have yet (aheadMark), or that MarkLost says may have been
// lost.
func (s *StateDB) Load(dev, metric string, start int64) (w aggregate.WindowState, found bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("read state %s: %v", s.Path, r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	key := windowKey(nil, dev, metric, start)
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketWindows).Get(key)
		if v == nil {
			return nil
		}
		tag, sw, derr := decodeWindowState(key, v)
		if derr == nil && s.ahead.set && tag > s.ahead.from && s.position != nil && s.position() <= tag {
			derr = errWindowAhead
		}
		w, found = sw, derr == nil
		return derr
	})
	if err == nil && !found && start < s.lostBefore {
		err = errWindowLost
	}
	return w, found, err
}

// windowKey is the window start as 8 bytes that sort like the signed
// number, then device and metric (uvarint length + bytes each). Keys are in
// time order: windows closing now are appended at the end of the tree, so a
// checkpoint rewrites few pages (ordered by series, every series' last leaf
// would be rewritten each time: a 4 KiB page per window), and expired ones
// are at the front.
func windowKey(b []byte, dev, metric string, start int64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(start)^(1<<63))
	return seriesKey(b, dev, metric)
}

func seriesKey(b []byte, dev, metric string) []byte {
	b = appendString(b, dev)
	return appendString(b, metric)
}

// deviceOf returns the device part of a series key (its length and name).
func deviceOf(series []byte) []byte {
	n, l := binary.Uvarint(series)
	if l <= 0 || uint64(len(series)-l) < n {
		return nil
	}
	return series[:l+int(n)]
}

func startOf(key []byte) int64 {
	return int64(binary.BigEndian.Uint64(key[:8]) ^ (1 << 63))
}

// appendWindowState appends the stored value of window w under key,
// written by the checkpoint of journal sequence tag: version 3, uvarint
// tag, the window, its readings by timing, and a CRC-32C of key and
// value (bbolt checks neither).
func appendWindowState(b []byte, key []byte, tag uint64, w aggregate.WindowState) []byte {
	at := len(b)
	b = append(b, 3) // version: 2 added the tag and checksum, 3 the readings by timing
	b = binary.AppendUvarint(b, tag)
	b = binary.AppendVarint(b, w.Start)
	b = binary.AppendVarint(b, w.Count)
	for _, f := range [...]float64{w.Min, w.Max, w.Sum, w.Mean, w.M2, w.First, w.Last} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	b = binary.AppendVarint(b, w.FirstT)
	b = binary.AppendVarint(b, w.LastT)
	b = binary.AppendVarint(b, w.Late)
	b = binary.AppendVarint(b, int64(w.Revision))
	b = appendString(b, w.Unit)
	for _, n := range [...]int64{w.DeviceTimed, w.Replaced, w.Rebased, w.Unverified} {
		b = binary.AppendVarint(b, n)
	}
	sum := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, b[at:])
	return binary.LittleEndian.AppendUint32(b, sum)
}

var errWindowState = errors.New("undecodable stored window")

// checkWindowState checks the stored value v of key as decodeWindowState
// would, and returns its tag: from version 2 on the checksum is enough (it
// covers what was written), and nothing is allocated.
func checkWindowState(key, v []byte) (tag uint64, err error) {
	if len(v) < 5 || v[0] < 2 {
		tag, _, err = decodeWindowState(key, v)
		return tag, err
	}
	body := v[:len(v)-4]
	if crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, body) != binary.LittleEndian.Uint32(v[len(v)-4:]) {
		return 0, fmt.Errorf("%w: checksum mismatch", errWindowState)
	}
	tag, n := binary.Uvarint(body[1:])
	if n <= 0 {
		return 0, errWindowState
	}
	return tag, nil
}

// decodeWindowState decodes the stored value v of key: version 3 (with
// its tag, readings by timing and checksum), 2 (tag and checksum) or 1
// (tag 0, no checksum). Windows written before version 3 are read as all
// stamped by their devices.
func decodeWindowState(key, v []byte) (tag uint64, w aggregate.WindowState, err error) {
	if len(v) == 0 {
		return 0, w, errWindowState
	}
	r := reader{b: v[1:], ok: true}
	version := v[0]
	switch version {
	case 1:
	case 2, 3:
		if len(v) < 5 {
			return 0, w, errWindowState
		}
		body := v[:len(v)-4]
		if crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, body) != binary.LittleEndian.Uint32(v[len(v)-4:]) {
			return 0, w, fmt.Errorf("%w: checksum mismatch", errWindowState)
		}
		r.b = body[1:]
		tag = r.uvarint()
	default:
		return 0, w, errWindowState
	}
	w.Start, w.Count = r.varint(), r.varint()
	for _, f := range [...]*float64{&w.Min, &w.Max, &w.Sum, &w.Mean, &w.M2, &w.First, &w.Last} {
		if len(r.b) < 8 {
			return 0, w, errWindowState
		}
		*f = math.Float64frombits(binary.LittleEndian.Uint64(r.b))
		r.b = r.b[8:]
	}
	w.FirstT, w.LastT, w.Late = r.varint(), r.varint(), r.varint()
	w.Revision = int(r.varint())
	w.Unit = string(r.bytes())
	if version == 3 {
		w.DeviceTimed, w.Replaced, w.Rebased, w.Unverified = r.varint(), r.varint(), r.varint(), r.varint()
	} else {
		w.DeviceTimed = w.Count // before timings: taken as the devices' times
	}
	if !r.ok || len(r.b) != 0 || len(key) < 8 || startOf(key) != w.Start {
		return 0, w, errWindowState
	}
	return tag, w, nil
}

// encodeAhead is the value of ahead: version 1, uvarint from, uvarint
// until, CRC-32C.
func encodeAhead(a aheadMark) []byte {
	b := binary.AppendUvarint([]byte{1}, a.from)
	b = binary.AppendUvarint(b, a.until)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeAhead(v []byte) (aheadMark, error) {
	if len(v) < 7 || v[0] != 1 || crc32.Checksum(v[:len(v)-4], castagnoli) != binary.LittleEndian.Uint32(v[len(v)-4:]) {
		return aheadMark{}, errors.New("damaged ahead")
	}
	r := reader{b: v[1 : len(v)-4], ok: true}
	a := aheadMark{set: true, from: r.uvarint(), until: r.uvarint()}
	if !r.ok || len(r.b) != 0 {
		return aheadMark{}, errors.New("damaged ahead")
	}
	return a, nil
}

// encodeLost is the value of lost_before: version 1, varint, CRC-32C.
func encodeLost(before int64) []byte {
	b := binary.AppendVarint([]byte{1}, before)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeLost(v []byte) (int64, error) {
	if len(v) < 6 || v[0] != 1 || crc32.Checksum(v[:len(v)-4], castagnoli) != binary.LittleEndian.Uint32(v[len(v)-4:]) {
		return 0, errors.New("damaged lost_before")
	}
	r := reader{b: v[1 : len(v)-4], ok: true}
	l := r.varint()
	if !r.ok || len(r.b) != 0 {
		return 0, errors.New("damaged lost_before")
	}
	return l, nil
}
