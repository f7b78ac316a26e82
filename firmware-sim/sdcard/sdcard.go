// Package sdcard is a storage card that loses power: a FUSE filesystem
// that keeps every write, truncate, create, rename and unlink pending
// until it is made durable the way POSIX says it is (fsync or fdatasync
// of a file for its data and size; fsync of a directory for its entries),
// and that on PowerCut throws away everything that was not.
//
// It is the disk of the power-cut tests. A SIGKILL keeps the page cache,
// so a process killed mid-write loses nothing the kernel already has; a
// power cut loses every write and every directory entry that was not
// synced, and on an SD card may tear the last page or land unsynced
// writes in any order. PowerCut can do each of those (Loss).
//
// The card is held in memory (a test's data directory is a few tens of
// megabytes): the durable image is then exact and a cut is instant, with
// no lower filesystem whose own caching could blur what was synced. It is
// served by the test process, so it outlives the process under test,
// which uses it through the kernel like any other filesystem (flock,
// mmap, O_APPEND and all). PowerCut unmounts it and mounts the surviving
// image at the same place, so that no page the kernel cached survives
// either.
//
// FreezeAt stops the card at a chosen operation (the moment power is
// lost): that operation and every one after it block and never change
// the card, until PowerCut.
package sdcard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Loss is what a power cut does to the writes that were not synced.
type Loss int

const (
	// LoseUnsynced: every unsynced write and truncate is gone.
	LoseUnsynced Loss = iota
	// TornWrite: each file's unsynced writes reached the card in order up
	// to one, of which only a prefix did.
	TornWrite
	// Reordered: any subset of each file's unsynced writes reached the
	// card, whatever their order.
	Reordered
)

func (l Loss) String() string {
	switch l {
	case LoseUnsynced:
		return "lose-unsynced"
	case TornWrite:
		return "torn-write"
	case Reordered:
		return "reordered"
	}
	return fmt.Sprintf("loss(%d)", int(l))
}

// OpKind is the kind of a filesystem operation, as FreezeAt sees it.
type OpKind int

const (
	OpRead OpKind = iota
	OpWrite
	OpTruncate
	OpFsync // a file's or a directory's
	OpCreate
	OpMkdir
	OpRename
	OpUnlink
	OpRmdir
)

func (k OpKind) String() string {
	return [...]string{"read", "write", "truncate", "fsync", "create", "mkdir", "rename", "unlink", "rmdir"}[k]
}

// Op is one operation on the card. Path is relative to the mount point
// ("" is the root); To is a rename's new path.
type Op struct {
	Kind OpKind
	Path string
	To   string
}

func (o Op) String() string {
	if o.To != "" {
		return fmt.Sprintf("%s %s -> %s", o.Kind, o.Path, o.To)
	}
	return fmt.Sprintf("%s %s", o.Kind, o.Path)
}

// Report says what a power cut threw away.
type Report struct {
	Loss           Loss
	FrozenAt       string // the operation FreezeAt stopped at, if any
	Files          int    // files on the card after the cut
	UnsyncedFiles  int    // files that had writes or truncates not synced
	LostBytes      int64  // bytes of unsynced writes that did not survive
	KeptBytes      int64  // bytes of unsynced writes that did (TornWrite, Reordered)
	UndoneEntries  int    // directory entries whose change was not synced
	PendingChanges int    // unsynced writes and truncates, in all
}

func (r Report) String() string {
	s := fmt.Sprintf("%s: %d files, %d with unsynced data (%d changes: %d bytes lost, %d kept), %d entries undone",
		r.Loss, r.Files, r.UnsyncedFiles, r.PendingChanges, r.LostBytes, r.KeptBytes, r.UndoneEntries)
	if r.FrozenAt != "" {
		s += ", frozen at " + r.FrozenAt
	}
	return s
}

// Card is a mounted card.
type Card struct {
	dir string
	rng *rand.Rand

	mu       sync.Mutex
	root     *dirNode
	server   *fuse.Server
	nextIno  uint64
	trigger  func(Op) bool
	frozen   bool
	frozenAt string
	frozenCh chan struct{} // closed when the card freezes
	thaw     chan struct{} // closed to release the operations blocked on a frozen card
}

// Mount mounts an empty card on dir (which must exist). seed makes the
// choices of TornWrite and Reordered repeatable.
func Mount(dir string, seed uint64) (*Card, error) {
	c := &Card{dir: dir, rng: rand.New(rand.NewPCG(seed, seed^0x5dcad)), nextIno: 1}
	root := &dirNode{node: node{c: c, mode: 0o755}, durable: map[string]fs.InodeEmbedder{}}
	if err := c.mount(root); err != nil {
		return nil, err
	}
	return c, nil
}

// Dir is the mount point.
func (c *Card) Dir() string { return c.dir }

func (c *Card) mount(root *dirNode) error {
	c.mu.Lock()
	c.root, c.frozen, c.frozenAt, c.trigger = root, false, "", nil
	c.frozenCh, c.thaw = make(chan struct{}), make(chan struct{})
	c.mu.Unlock()
	zero := time.Duration(0)
	server, err := fs.Mount(c.dir, root, &fs.Options{
		MountOptions: fuse.MountOptions{FsName: "sdcard", Name: "sdcard", DirectMount: true},
		// Nothing changes the card but the kernel's own requests, so its
		// caches stay right; failed lookups are not cached, so that a
		// file created after one is seen.
		NegativeTimeout: &zero,
		OnAdd:           func(ctx context.Context) { root.populate(ctx) },
	})
	if err != nil {
		return fmt.Errorf("mount sdcard on %s: %w (is fuse3 installed, and /dev/fuse usable?)", c.dir, err)
	}
	c.server = server
	return nil
}

// Unmount unmounts the card; what it holds is lost.
func (c *Card) Unmount() error {
	c.Freeze()
	c.release()
	return c.unmount()
}

func (c *Card) unmount() error {
	var err error
	for range 50 {
		if err = c.server.Unmount(); err == nil {
			c.server.Wait()
			return nil
		}
		time.Sleep(20 * time.Millisecond) // EBUSY: a process has not closed its files yet
	}
	return fmt.Errorf("unmount sdcard %s: %w", c.dir, err)
}

// FreezeAt arms a trigger: the first operation for which match returns
// true freezes the card (see Freeze) before it takes effect. nil
// disarms it.
func (c *Card) FreezeAt(match func(Op) bool) {
	c.mu.Lock()
	c.trigger = match
	c.mu.Unlock()
}

// Freeze stops the card now: from here on every operation blocks without
// effect until PowerCut (or fails, once Release is called).
func (c *Card) Freeze() {
	c.mu.Lock()
	c.freezeLocked("")
	c.mu.Unlock()
}

func (c *Card) freezeLocked(at string) {
	if !c.frozen {
		c.frozen, c.frozenAt = true, at
		close(c.frozenCh)
	}
}

// Frozen is closed when the card freezes.
func (c *Card) Frozen() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozenCh
}

// FrozenAt is the operation the trigger stopped at, "" if none did.
func (c *Card) FrozenAt() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozenAt
}

// release makes the operations blocked on the frozen card fail with EIO
// (the card stays frozen: they change nothing). A process killed while
// it waited on the card can then finish dying.
func (c *Card) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.thaw:
	default:
		close(c.thaw)
	}
}

// Release fails, with EIO, the operations blocked on a frozen card.
func (c *Card) Release() { c.release() }

// PowerCut loses power: the card freezes (if it has not), what was not
// durable is thrown away as loss says, and the card is mounted again
// with what survived. Processes using the card must have been killed:
// the unmount waits for their files to close.
func (c *Card) PowerCut(loss Loss) (Report, error) {
	c.Freeze()
	c.release()
	c.mu.Lock()
	rep := Report{Loss: loss, FrozenAt: c.frozenAt}
	root := c.survivors(c.root, loss, &rep, map[fs.InodeEmbedder]fs.InodeEmbedder{}).(*dirNode)
	c.mu.Unlock()
	if err := c.unmount(); err != nil {
		return rep, err
	}
	return rep, c.mount(root)
}

// enter admits an operation. On success it returns with c.mu held; on a
// frozen card it blocks until the operation is released or cancelled.
func (c *Card) enter(ctx context.Context, op Op) syscall.Errno {
	c.mu.Lock()
	if !c.frozen && c.trigger != nil && c.trigger(op) {
		c.freezeLocked(op.String())
	}
	if !c.frozen {
		return 0
	}
	thaw := c.thaw
	c.mu.Unlock()
	select {
	case <-thaw:
		return syscall.EIO
	case <-ctx.Done():
		return syscall.EINTR
	}
}

func (c *Card) ino() uint64 {
	c.nextIno++
	return c.nextIno
}

// survivors builds the card that a power cut leaves of n: a directory's
// durable entries, each file's durable data (plus, for TornWrite and
// Reordered, some of what was pending). done maps nodes already built,
// so that a file linked twice stays one file.
func (c *Card) survivors(n fs.InodeEmbedder, loss Loss, rep *Report, done map[fs.InodeEmbedder]fs.InodeEmbedder) fs.InodeEmbedder {
	if s, ok := done[n]; ok {
		return s
	}
	switch n := n.(type) {
	case *dirNode:
		d := &dirNode{node: node{c: c, mode: n.mode, mtime: n.mtime}, durable: map[string]fs.InodeEmbedder{}}
		done[n] = d
		rep.UndoneEntries += n.undone()
		for name, child := range n.durable {
			d.durable[name] = c.survivors(child, loss, rep, done)
		}
		return d
	case *fileNode:
		rep.Files++
		f := &fileNode{node: node{c: c, mode: n.mode, mtime: n.mtime}}
		f.data = n.survive(loss, c.rng, rep)
		f.durable = append([]byte(nil), f.data...)
		done[n] = f
		return f
	}
	panic(fmt.Sprintf("sdcard: unknown node %T", n))
}

// node is what files and directories share.
type node struct {
	fs.Inode
	c     *Card
	mode  uint32 // permission bits
	mtime time.Time
}

func (n *node) path() string {
	return n.Path(n.c.root.EmbeddedInode())
}

func (n *node) childPath(name string) string {
	if p := n.path(); p != "" {
		return p + "/" + name
	}
	return name
}

// dirNode is a directory. Its current entries are the Inode's children;
// durable are those of its last fsync.
type dirNode struct {
	node
	durable map[string]fs.InodeEmbedder
}

var (
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeFsyncer   = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
)

// populate adds the durable entries of a freshly mounted card to the tree.
func (d *dirNode) populate(ctx context.Context) {
	inodes := map[fs.InodeEmbedder]*fs.Inode{}
	var add func(d *dirNode)
	add = func(d *dirNode) {
		for name, child := range d.durable {
			in, ok := inodes[child]
			if !ok {
				mode := uint32(syscall.S_IFREG)
				if _, dir := child.(*dirNode); dir {
					mode = syscall.S_IFDIR
				}
				in = d.NewPersistentInode(ctx, child, fs.StableAttr{Mode: mode, Ino: d.c.ino()})
				inodes[child] = in
				if sub, dir := child.(*dirNode); dir {
					add(sub)
				}
			}
			d.AddChild(name, in, false)
		}
	}
	add(d)
}

// undone counts the entries whose current state differs from the durable.
func (d *dirNode) undone() int {
	n := 0
	cur := d.Children()
	for name, in := range cur {
		if d.durable[name] != in.Operations() {
			n++
		}
	}
	for name := range d.durable {
		if _, ok := cur[name]; !ok {
			n++
		}
	}
	return n
}

func (d *dirNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := d.c.enter(ctx, Op{Kind: OpRead, Path: d.path()}); errno != 0 {
		return errno
	}
	defer d.c.mu.Unlock()
	out.Mode = syscall.S_IFDIR | d.mode
	out.Nlink = 2
	out.SetTimes(nil, &d.mtime, &d.mtime)
	return 0
}

func (d *dirNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := d.c.enter(ctx, Op{Kind: OpTruncate, Path: d.path()}); errno != 0 {
		return errno
	}
	if m, ok := in.GetMode(); ok {
		d.mode = m & 0o7777
	}
	d.c.mu.Unlock()
	return d.Getattr(ctx, fh, out)
}

func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const blocks = 1 << 24 // 64 GiB of 4 KiB blocks, nearly all free
	out.Blocks, out.Bfree, out.Bavail = blocks, blocks-1, blocks-1
	out.Files, out.Ffree = 1<<20, 1<<20-1
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	return 0
}

func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := d.c.enter(ctx, Op{Kind: OpCreate, Path: d.childPath(name)}); errno != 0 {
		return nil, nil, 0, errno
	}
	defer d.c.mu.Unlock()
	if d.GetChild(name) != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	f := &fileNode{node: node{c: d.c, mode: mode & 0o7777, mtime: time.Now()}}
	in := d.NewPersistentInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: d.c.ino()})
	f.attr(&out.Attr)
	d.mtime = f.mtime
	return in, nil, 0, 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := d.c.enter(ctx, Op{Kind: OpMkdir, Path: d.childPath(name)}); errno != 0 {
		return nil, errno
	}
	defer d.c.mu.Unlock()
	if d.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	sub := &dirNode{node: node{c: d.c, mode: mode & 0o7777, mtime: time.Now()}, durable: map[string]fs.InodeEmbedder{}}
	in := d.NewPersistentInode(ctx, sub, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: d.c.ino()})
	out.Mode = syscall.S_IFDIR | sub.mode
	d.mtime = sub.mtime
	return in, 0
}

func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := d.c.enter(ctx, Op{Kind: OpUnlink, Path: d.childPath(name)}); errno != 0 {
		return errno
	}
	defer d.c.mu.Unlock()
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if ch.IsDir() {
		return syscall.EISDIR
	}
	d.mtime = time.Now()
	return 0
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := d.c.enter(ctx, Op{Kind: OpRmdir, Path: d.childPath(name)}); errno != 0 {
		return errno
	}
	defer d.c.mu.Unlock()
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if !ch.IsDir() {
		return syscall.ENOTDIR
	}
	if len(ch.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	d.mtime = time.Now()
	return 0
}

func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EXDEV
	}
	if errno := d.c.enter(ctx, Op{Kind: OpRename, Path: d.childPath(name), To: np.childPath(newName)}); errno != 0 {
		return errno
	}
	defer d.c.mu.Unlock()
	if flags&fs.RENAME_EXCHANGE != 0 {
		return syscall.EINVAL
	}
	src := d.GetChild(name)
	if src == nil {
		return syscall.ENOENT
	}
	if dst := np.GetChild(newName); dst != nil {
		if flags&renameNoReplace != 0 {
			return syscall.EEXIST
		}
		if dst.IsDir() != src.IsDir() {
			if dst.IsDir() {
				return syscall.EISDIR
			}
			return syscall.ENOTDIR
		}
		if dst.IsDir() && len(dst.Children()) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	d.mtime, np.mtime = time.Now(), time.Now()
	return 0
}

// renameNoReplace is renameat2's RENAME_NOREPLACE.
const renameNoReplace = 1

// Fsync of a directory makes its current entries durable.
func (d *dirNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if errno := d.c.enter(ctx, Op{Kind: OpFsync, Path: d.path()}); errno != 0 {
		return errno
	}
	defer d.c.mu.Unlock()
	clear(d.durable)
	for name, in := range d.Children() {
		d.durable[name] = in.Operations()
	}
	return 0
}

// fileNode is a regular file: data is what readers see, durable what a
// power cut leaves, pending the writes and truncates in between.
type fileNode struct {
	node
	data    []byte
	durable []byte
	pending []change
}

// change is an unsynced write (data at off) or truncate (to size).
type change struct {
	off      int64
	data     []byte
	truncate bool
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
)

func (f *fileNode) attr(out *fuse.Attr) {
	out.Mode = syscall.S_IFREG | f.mode
	out.Size = uint64(len(f.data))
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 4096
	out.Nlink = 1
	out.SetTimes(nil, &f.mtime, &f.mtime)
}

func (f *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := f.c.enter(ctx, Op{Kind: OpRead, Path: f.path()}); errno != 0 {
		return errno
	}
	defer f.c.mu.Unlock()
	f.attr(&out.Attr)
	return 0
}

func (f *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if errno := f.c.enter(ctx, Op{Kind: OpTruncate, Path: f.path()}); errno != 0 {
		return errno
	}
	defer f.c.mu.Unlock()
	if size, ok := in.GetSize(); ok {
		f.truncate(int64(size))
	}
	if m, ok := in.GetMode(); ok {
		f.mode = m & 0o7777
	}
	if mt, ok := in.GetMTime(); ok {
		f.mtime = mt
	}
	f.attr(&out.Attr)
	return 0
}

func (f *fileNode) truncate(size int64) {
	f.data = resize(f.data, size)
	f.pending = append(f.pending, change{off: size, truncate: true})
	f.mtime = time.Now()
}

func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		if errno := f.c.enter(ctx, Op{Kind: OpTruncate, Path: f.path()}); errno != 0 {
			return nil, 0, errno
		}
		f.truncate(0)
		f.c.mu.Unlock()
	}
	return nil, 0, 0
}

func (f *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := f.c.enter(ctx, Op{Kind: OpRead, Path: f.path()}); errno != 0 {
		return nil, errno
	}
	defer f.c.mu.Unlock()
	if off >= int64(len(f.data)) {
		return fuse.ReadResultData(nil), 0
	}
	n := copy(dest, f.data[off:])
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.c.enter(ctx, Op{Kind: OpWrite, Path: f.path()}); errno != 0 {
		return 0, errno
	}
	defer f.c.mu.Unlock()
	f.data = writeAt(f.data, data, off)
	f.pending = append(f.pending, change{off: off, data: append([]byte(nil), data...)})
	f.mtime = time.Now()
	return uint32(len(data)), 0
}

// Fsync (and fdatasync) of a file makes its data and size durable.
func (f *fileNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if errno := f.c.enter(ctx, Op{Kind: OpFsync, Path: f.path()}); errno != 0 {
		return errno
	}
	defer f.c.mu.Unlock()
	for _, ch := range f.pending {
		f.durable = ch.apply(f.durable)
	}
	f.pending = nil
	return 0
}

// survive is the data a power cut leaves of the file.
func (f *fileNode) survive(loss Loss, rng *rand.Rand, rep *Report) []byte {
	out := append([]byte(nil), f.durable...)
	if len(f.pending) == 0 {
		return out
	}
	rep.UnsyncedFiles++
	rep.PendingChanges += len(f.pending)
	keep := make([]bool, len(f.pending))
	torn, tornAt := -1, 0
	switch loss {
	case TornWrite:
		k := rng.IntN(len(f.pending) + 1)
		for i := range k {
			keep[i] = true
		}
		if k < len(f.pending) && !f.pending[k].truncate && len(f.pending[k].data) > 0 {
			torn, tornAt = k, rng.IntN(len(f.pending[k].data))
		}
	case Reordered:
		for i := range keep {
			keep[i] = rng.IntN(2) == 0
		}
	}
	for i, ch := range f.pending {
		switch {
		case keep[i]:
			out = ch.apply(out)
			rep.KeptBytes += int64(len(ch.data))
		case i == torn:
			out = writeAt(out, ch.data[:tornAt], ch.off)
			rep.KeptBytes += int64(tornAt)
			rep.LostBytes += int64(len(ch.data) - tornAt)
		default:
			rep.LostBytes += int64(len(ch.data))
		}
	}
	return out
}

func (ch change) apply(b []byte) []byte {
	if ch.truncate {
		return resize(b, ch.off)
	}
	return writeAt(b, ch.data, ch.off)
}

func writeAt(b, data []byte, off int64) []byte {
	if end := off + int64(len(data)); end > int64(len(b)) {
		b = resize(b, end)
	}
	copy(b[off:], data)
	return b
}

func resize(b []byte, size int64) []byte {
	if size <= int64(len(b)) {
		clear(b[size:])
		return b[:size]
	}
	if size <= int64(cap(b)) {
		return b[:size] // the bytes past len were cleared when it shrank
	}
	nb := make([]byte, size, size+size/4)
	copy(nb, b)
	return nb
}

// Available reports whether FUSE can be mounted here: /dev/fuse exists
// and either this is root or fusermount3 is installed.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("no /dev/fuse: %w", err)
	}
	if os.Geteuid() == 0 {
		return nil
	}
	for _, p := range []string{"/bin/fusermount3", "/usr/bin/fusermount3", "/bin/fusermount", "/usr/bin/fusermount"} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return errors.New("not root and no fusermount3 (apt-get install fuse3)")
}
