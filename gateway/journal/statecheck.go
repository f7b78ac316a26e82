package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"strings"
)

// The state file is read here with plain reads and a bounds check on every
// offset, never through bbolt. bbolt trusts its file: opened with
// NoFreelistSync it walks the whole tree to find the free pages, in a
// goroutine of its own (db.go, freepages), and a damaged page met there (a
// page header naming another page or no page type, an element offset
// pointing outside the mapping) is an assertion panic or a memory fault in
// that goroutine, which no recover can catch: the process dies, and under
// Restart=on-failure dies again at every start. bbolt also has no checksum
// on its data pages, so a flipped byte in a value is read back as true.
//
// A walk here checks everything bbolt's walk and our reads rely on: the
// meta pages as bbolt chooses between them (magic, version, FNV-64a
// checksum), then every page reachable from the chosen root: its header
// names it, it is a branch or a leaf, its span (with overflow pages) lies
// below the high-water mark and inside the file, is referenced once and is
// exactly what its data needs; its keys and values are packed after the
// element array as bbolt writes them, keys in order within the page and
// within the range the parent gives them; the top-level buckets are those
// the gateway writes. The values are the caller's to check (OpenStateDB:
// the checkpoint's CRC, each window's over key and value). The layout is
// that of go.etcd.io/bbolt v1.x (internal/common/page.go, meta.go,
// inode.go), little-endian as on every target.

const (
	boltMagic     = 0xED0CDAED
	boltVersion   = 2
	pageHeader    = 16 // id u64, flags u16, count u16, overflow u32
	elemSize      = 16 // leaf: flags, pos, ksize, vsize (u32 each); branch: pos, ksize u32, pgid u64
	metaChecksum  = 56 // offset of the checksum in the meta: FNV-64a of the bytes before it
	flagBranch    = 0x01
	flagLeaf      = 0x02
	flagFreelist  = 0x10
	bucketEntry   = 0x01
	noFreelist    = ^uint64(0)
	inBucketBytes = 16 // root pgid u64, sequence u64

	// maxSpan bounds a page with its overflow pages: the largest value
	// the gateway writes is a checkpoint (megabytes); a span beyond this is
	// a damaged overflow count, not a value, and is not read into memory.
	maxSpan = 1 << 30
	// maxDepth bounds the tree: bbolt's trees are a few levels deep.
	maxDepth = 32
)

// boltMeta is one of the two meta pages.
type boltMeta struct {
	err                       error // nil if magic, version and checksum are right
	pageSize                  uint32
	root, freelist, hwm, txid uint64
}

func parseMeta(b []byte) boltMeta {
	if len(b) < pageHeader+64 {
		return boltMeta{err: errors.New("short meta page")}
	}
	m := b[pageHeader : pageHeader+64]
	le := binary.LittleEndian
	h := fnv.New64a()
	h.Write(m[:metaChecksum])
	meta := boltMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), hwm: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	switch {
	case le.Uint32(m[0:]) != boltMagic:
		meta.err = errors.New("bad magic")
	case le.Uint32(m[4:]) != boltVersion:
		meta.err = fmt.Errorf("version %d", le.Uint32(m[4:]))
	case le.Uint64(m[metaChecksum:]) != h.Sum64():
		meta.err = errors.New("checksum mismatch")
	}
	return meta
}

// boltFile is a state file opened for inspection.
type boltFile struct {
	r     *blockReader
	size  int64
	ps    int64       // page size
	metas [2]boltMeta // meta pages 0 and 1
	cur   int         // the meta bbolt will use; -1 if neither is valid
}

// readBoltFile reads the meta pages the way bbolt does (db.go getPageSize,
// mmap, meta): the page size from meta 0 if it is valid, else from the
// first valid meta found at 1 KiB × 2^i; then the meta with the higher
// transaction id if it is valid, else the other.
func readBoltFile(r io.ReaderAt, size int64) *boltFile {
	f := &boltFile{r: &blockReader{r: r, size: size, blocks: map[int64][]byte{}}, size: size, cur: -1}
	buf := make([]byte, 4096)
	n, _ := r.ReadAt(buf, 0)
	if m := parseMeta(buf[:n]); m.err == nil {
		f.ps = int64(m.pageSize)
	} else {
		for i := range 15 {
			pos := int64(1024) << i
			if pos >= size-1024 {
				break
			}
			n, _ := r.ReadAt(buf, pos)
			if m := parseMeta(buf[:n]); m.err == nil {
				f.ps = int64(m.pageSize)
				break
			}
		}
	}
	if f.ps < 1024 || f.ps > 1<<24 || size < 2*f.ps {
		f.metas[0].err, f.metas[1].err = errors.New("no valid meta page"), errors.New("no valid meta page")
		return f
	}
	for i := range f.metas {
		n, _ := r.ReadAt(buf[:pageHeader+64], int64(i)*f.ps)
		// Only what bbolt checks decides which meta it uses; what else
		// is wrong with the chosen one is a problem of its tree (walk).
		f.metas[i] = parseMeta(buf[:n])
	}
	a, b := 0, 1
	if f.metas[1].txid > f.metas[0].txid {
		a, b = 1, 0
	}
	switch {
	case f.metas[a].err == nil:
		f.cur = a
	case f.metas[b].err == nil:
		f.cur = b
	}
	return f
}

// treeVisitor receives what a walk finds: every key and value of the
// buckets meta and windows (k and v are valid during the call only).
type treeVisitor func(bucket []byte, k, v []byte)

// treeWalk walks the tree of one meta page.
type treeWalk struct {
	f        *boltFile
	m        boltMeta
	seen     []uint64 // pages reached, a bitset
	problems []string // the first few, for the log
	nprob    int
	// damaged counts subtrees of the windows bucket that could not be
	// read (their windows are lost); buckets records which of the
	// expected buckets were found.
	damaged int
	buckets map[string]bool
	// metaDamaged is set when the meta bucket could not be read whole
	// (its checkpoint cannot be trusted), rootDamaged when nothing could.
	metaDamaged, rootDamaged bool
	// onPage, if set, is told of every page read whole (StatePages).
	onPage func(id, span uint64, branch bool, bucket, first, last []byte)
	bucket []byte // the bucket being walked (nil: the root)
}

func (w *treeWalk) problem(format string, args ...any) {
	w.nprob++
	if len(w.problems) < 8 {
		w.problems = append(w.problems, fmt.Sprintf(format, args...))
	}
}

// page reads page id with its overflow pages, after checking that the
// span is in the file, below the high-water mark and not reached before.
func (w *treeWalk) page(id uint64) ([]byte, error) {
	if id < 2 || id >= w.m.hwm {
		return nil, fmt.Errorf("page %d: outside the file's pages 2–%d", id, w.m.hwm-1)
	}
	ps := w.f.ps
	b, err := w.f.r.span(int64(id)*ps, ps)
	if err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(b); got != id {
		return nil, fmt.Errorf("page %d: its header names page %d", id, got)
	}
	overflow := uint64(le.Uint32(b[12:]))
	if id+overflow >= w.m.hwm || (overflow+1)*uint64(ps) > maxSpan {
		return nil, fmt.Errorf("page %d: %d overflow pages run past the high-water mark %d", id, overflow, w.m.hwm)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p/64]&(1<<(p%64)) != 0 {
			return nil, fmt.Errorf("page %d: referenced twice", p)
		}
	}
	for p := id; p <= id+overflow; p++ {
		w.seen[p/64] |= 1 << (p % 64)
	}
	if overflow > 0 {
		if b, err = w.f.r.span(int64(id)*ps, int64(overflow+1)*ps); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return b, nil
}

// element is one element of a branch or leaf page.
type element struct {
	flags uint32
	key   []byte
	value []byte // leaf
	child uint64 // branch
}

// elements parses a page's elements, checking that keys are non-empty,
// in order and within [lo, hi) (nil: unbounded), and that keys and values
// are packed one after the other from the end of the element array, as
// bbolt writes them (internal/common/inode.go, WriteInodeToPage): so a
// changed count, offset or size shows. It returns where the data ends.
func elements(p []byte, branch bool, lo, hi []byte) ([]element, uint64, error) {
	le := binary.LittleEndian
	count := uint64(le.Uint16(p[10:]))
	data := pageHeader + count*elemSize
	if data > uint64(len(p)) {
		return nil, 0, fmt.Errorf("%d elements do not fit in %d bytes", count, len(p))
	}
	if branch && count == 0 {
		return nil, 0, errors.New("branch page without elements")
	}
	els := make([]element, count)
	next := data
	for i := range count {
		at := pageHeader + i*elemSize
		e := p[at : at+elemSize]
		var pos, ksize, vsize uint64
		if branch {
			pos, ksize = uint64(le.Uint32(e)), uint64(le.Uint32(e[4:]))
			els[i].child = le.Uint64(e[8:])
		} else {
			els[i].flags = le.Uint32(e)
			pos, ksize, vsize = uint64(le.Uint32(e[4:])), uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
		}
		start := at + pos
		if ksize == 0 || start != next || start+ksize+vsize > uint64(len(p)) {
			return nil, 0, fmt.Errorf("element %d: key at %d (%d bytes) and value (%d bytes), want them at %d, within %d bytes",
				i, start, ksize, vsize, next, len(p))
		}
		next = start + ksize + vsize
		els[i].key = p[start : start+ksize]
		els[i].value = p[start+ksize : next]
		if !branch && els[i].flags&^bucketEntry != 0 {
			return nil, 0, fmt.Errorf("element %d: flags %#x", i, els[i].flags)
		}
		if i > 0 && bytes.Compare(els[i-1].key, els[i].key) >= 0 {
			return nil, 0, fmt.Errorf("element %d: keys out of order", i)
		}
		if lo != nil && bytes.Compare(els[i].key, lo) < 0 || hi != nil && bytes.Compare(els[i].key, hi) >= 0 {
			return nil, 0, fmt.Errorf("element %d: key outside the range its parent gives", i)
		}
	}
	return els, next, nil
}

// node walks the subtree of page id (or the inline page p, when id is 0),
// whose keys lie in [lo, hi), calling leaf for each leaf element. A
// damaged child is reported and skipped, so that what can be read is.
func (w *treeWalk) node(id uint64, p []byte, lo, hi []byte, depth int, leaf func(element) error) error {
	if depth > maxDepth {
		return fmt.Errorf("page %d: tree deeper than %d", id, maxDepth)
	}
	if p == nil {
		var err error
		if p, err = w.page(id); err != nil {
			return err
		}
	}
	if len(p) < pageHeader {
		return errors.New("inline page too short")
	}
	flags := binary.LittleEndian.Uint16(p[8:])
	switch flags {
	case flagBranch, flagLeaf:
	default:
		return fmt.Errorf("page %d: type %#x, not a branch or a leaf", id, flags)
	}
	if flags == flagBranch && id == 0 {
		return errors.New("inline page is a branch")
	}
	els, end, err := elements(p, flags == flagBranch, lo, hi)
	if err != nil {
		return fmt.Errorf("page %d: %w", id, err)
	}
	// bbolt gives a node exactly the pages its data needs (node.go,
	// spill), and an inline bucket exactly its bytes (bucket.go, write).
	le := binary.LittleEndian
	if id == 0 {
		if le.Uint64(p) != 0 || le.Uint32(p[12:]) != 0 || end != uint64(len(p)) {
			return fmt.Errorf("inline page: %d bytes of data in %d", end, len(p))
		}
	} else if ps := uint64(w.f.ps); end <= uint64(len(p))-ps && len(p) > int(ps) {
		return fmt.Errorf("page %d: %d bytes of data in %d pages", id, end, uint64(len(p))/ps)
	}
	if w.onPage != nil && id != 0 && len(els) > 0 {
		w.onPage(id, uint64(len(p))/uint64(w.f.ps), flags == flagBranch, w.bucket, els[0].key, els[len(els)-1].key)
	}
	if flags == flagLeaf {
		for _, e := range els {
			if err := leaf(e); err != nil {
				return fmt.Errorf("page %d: %w", id, err)
			}
		}
		return nil
	}
	for i, e := range els {
		next := hi
		if i+1 < len(els) {
			next = els[i+1].key
		}
		if err := w.node(e.child, nil, e.key, next, depth+1, leaf); err != nil {
			w.problem("%v", err)
			w.damaged++
		}
	}
	return nil
}

// walkBucket walks a bucket whose leaf entry has value v (its root page,
// or its inline page).
func (w *treeWalk) walkBucket(v []byte, leaf func(element) error) error {
	if len(v) < inBucketBytes {
		return errors.New("bucket header too short")
	}
	root := binary.LittleEndian.Uint64(v)
	if root == 0 {
		return w.node(0, v[inBucketBytes:], nil, nil, 0, leaf)
	}
	return w.node(root, nil, nil, nil, 0, leaf)
}

// walk is walkPages without a page hook.
func (f *boltFile) walk(m boltMeta, visit treeVisitor) *treeWalk {
	return f.walkPages(m, visit, nil)
}

// walkPages walks the tree of meta m, passing the entries of the buckets
// meta and windows to visit, and each page read whole to onPage (if not
// nil), and reports the problems found (none: bbolt can walk the tree and
// every read of it is inside the file).
func (f *boltFile) walkPages(m boltMeta, visit treeVisitor, onPage func(id, span uint64, branch bool, bucket, first, last []byte)) *treeWalk {
	w := &treeWalk{f: f, m: m, buckets: map[string]bool{}, onPage: onPage}
	if m.hwm > uint64(f.size/f.ps) || m.root < 2 || m.root >= m.hwm || int64(m.pageSize) != f.ps {
		w.problem("meta: high-water mark %d, root %d, page size %d do not fit the file's %d pages of %d bytes",
			m.hwm, m.root, m.pageSize, f.size/f.ps, f.ps)
		w.rootDamaged = true
		return w
	}
	w.seen = make([]uint64, m.hwm/64+1)
	err := w.node(m.root, nil, nil, nil, 0, func(e element) error {
		var name []byte
		switch {
		case e.flags&bucketEntry == 0:
		case bytes.Equal(e.key, bucketMeta):
			name = bucketMeta
		case bytes.Equal(e.key, bucketWindows):
			name = bucketWindows
		}
		if name == nil {
			w.problem("unexpected top-level entry %q", e.key)
			return nil
		}
		probs, damaged := w.nprob, w.damaged
		w.bucket = name
		err := w.walkBucket(e.value, func(e element) error {
			if e.flags&bucketEntry != 0 {
				return fmt.Errorf("unexpected bucket %q in %s", e.key, name)
			}
			visit(name, e.key, e.value)
			return nil
		})
		w.bucket = nil
		if err != nil {
			w.problem("bucket %s: %v", name, err)
		}
		if bytes.Equal(name, bucketMeta) {
			w.damaged = damaged // counts windows only
			w.metaDamaged = w.nprob > probs
		} else if w.nprob > probs && w.damaged == damaged {
			w.damaged++ // its root: every window is lost
		}
		w.buckets[string(name)] = true
		return nil
	})
	if err != nil {
		w.problem("root: %v", err)
		w.rootDamaged = true
		w.buckets = map[string]bool{}
		return w
	}
	if m.freelist != noFreelist {
		w.freelist(m.freelist)
	}
	return w
}

// freelist checks a freelist page (files written without NoFreelistSync):
// bbolt reads it at open instead of walking the tree.
func (w *treeWalk) freelist(id uint64) {
	p, err := w.page(id)
	if err != nil {
		w.problem("freelist: %v", err)
		return
	}
	le := binary.LittleEndian
	if flags := le.Uint16(p[8:]); flags != flagFreelist {
		w.problem("freelist page %d: type %#x", id, flags)
		return
	}
	at, count := uint64(pageHeader), uint64(le.Uint16(p[10:]))
	if count == 0xffff {
		count, at = le.Uint64(p[pageHeader:]), pageHeader+8
	}
	if count > (uint64(len(p))-at)/8 {
		w.problem("freelist page %d: %d ids do not fit", id, count)
		return
	}
	for i := range count {
		free := le.Uint64(p[at+8*i:])
		if free < 2 || free >= w.m.hwm || w.seen[free/64]&(1<<(free%64)) != 0 {
			w.problem("freelist page %d: page %d is not free", id, free)
			return
		}
	}
}

// StatePage describes one page of a state file.
type StatePage struct {
	ID uint64
	// Kind is "meta", "branch", "leaf", "overflow" (the pages after a
	// branch or leaf that its data fills) or "free" (in neither tree).
	Kind string
	// Bucket is what a tree page belongs to: "" (the root: the list of
	// buckets), "meta" (the checkpoint) or "windows".
	Bucket string
	// Current says that the tree bbolt uses reaches the page, Previous
	// that the other meta page's tree (its transaction before) does.
	Current, Previous bool
	// NewestMeta marks the meta page bbolt uses.
	NewestMeta bool
	// First and Last are the first and last keys of a branch or leaf.
	First, Last []byte
}

// StatePages lists the pages of the state file at path below its
// high-water mark: which holds what, as the trees of bbolt's two latest
// transactions reach them. It reads the file as OpenStateDB's check does,
// without bbolt, and is meant for diagnostics and tests on a file that is
// not in use.
func StatePages(path string) ([]StatePage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	bf := readBoltFile(f, fi.Size())
	if bf.cur < 0 {
		return nil, fmt.Errorf("%s: no valid meta page (meta 0: %v; meta 1: %v)", path, bf.metas[0].err, bf.metas[1].err)
	}
	hwm := bf.metas[bf.cur].hwm
	pages := make([]StatePage, min(hwm, uint64(fi.Size()/bf.ps)))
	for i := range pages {
		pages[i] = StatePage{ID: uint64(i), Kind: "free"}
	}
	for i := range 2 {
		pages[i].Kind, pages[i].NewestMeta = "meta", i == bf.cur
	}
	for _, i := range []int{bf.cur, 1 - bf.cur} {
		if bf.metas[i].err != nil {
			continue
		}
		w := bf.walkPages(bf.metas[i], func(_, _, _ []byte) {}, func(id, span uint64, branch bool, bucket, first, last []byte) {
			for p := id; p < id+span && p < uint64(len(pages)); p++ {
				pg := &pages[p]
				pg.Kind, pg.Bucket = "overflow", string(bucket)
				if p == id {
					pg.Kind, pg.First, pg.Last = "leaf", bytes.Clone(first), bytes.Clone(last)
					if branch {
						pg.Kind = "branch"
					}
				}
				if i == bf.cur {
					pg.Current = true
				} else {
					pg.Previous = true
				}
			}
		})
		if w.nprob > 0 && i == bf.cur {
			return pages, fmt.Errorf("%s: %s", path, strings.Join(w.problems, "; "))
		}
	}
	return pages, nil
}

// blockReader reads a file in blocks, keeping the last few: a tree walk
// reads pages near one another, and a read per page would cost a system
// call each. What span returns is never written to and stays valid after
// its block leaves the cache.
type blockReader struct {
	r      io.ReaderAt
	size   int64
	blocks map[int64][]byte // by block number
	order  []int64          // oldest first
}

const (
	readBlock  = 256 << 10
	readBlocks = 16
)

// span returns the n bytes at off.
func (b *blockReader) span(off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > b.size {
		return nil, fmt.Errorf("%d bytes at %d: past the end of the file (%d bytes)", n, off, b.size)
	}
	first, last := off/readBlock, (off+n-1)/readBlock
	if first == last {
		blk, err := b.block(first)
		if err != nil {
			return nil, err
		}
		at := off - first*readBlock
		return blk[at : at+n : at+n], nil
	}
	out := make([]byte, 0, n)
	for i := first; i <= last; i++ {
		blk, err := b.block(i)
		if err != nil {
			return nil, err
		}
		from, to := max(off, i*readBlock)-i*readBlock, min(off+n, (i+1)*readBlock)-i*readBlock
		out = append(out, blk[from:to]...)
	}
	return out, nil
}

func (b *blockReader) block(i int64) ([]byte, error) {
	if blk, ok := b.blocks[i]; ok {
		return blk, nil
	}
	blk := make([]byte, min(readBlock, b.size-i*readBlock))
	if _, err := b.r.ReadAt(blk, i*readBlock); err != nil && !(err == io.EOF && len(blk) > 0) {
		return nil, err
	}
	if len(b.order) >= readBlocks {
		delete(b.blocks, b.order[0])
		b.order = b.order[1:]
	}
	b.blocks[i] = blk
	b.order = append(b.order, i)
	return blk, nil
}
