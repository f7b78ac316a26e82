package sdcard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mount mounts a card for one test. Without FUSE the test is skipped,
// except in CI, where .ci/run installs it and a skip would hide a
// failure.
func mount(t *testing.T, seed uint64) *Card {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("FUSE: %v", err)
		}
		t.Skipf("FUSE: %v", err)
	}
	c, err := Mount(t.TempDir(), seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func write(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func cut(t *testing.T, c *Card, loss Loss) Report {
	t.Helper()
	rep, err := c.PowerCut(loss)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep)
	return rep
}

func content(t *testing.T, path string) ([]byte, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

// A write is durable after fsync of the file, and its file's entry only
// after fsync of the directory.
func TestUnsyncedIsLost(t *testing.T) {
	c := mount(t, 1)
	dir := c.Dir()
	write(t, filepath.Join(dir, "synced"), []byte("kept"), true)
	write(t, filepath.Join(dir, "unsynced"), []byte("lost"), false)
	syncDir(t, dir)
	write(t, filepath.Join(dir, "no-entry"), []byte("synced data, unsynced entry"), true)

	// Appended after the fsync, never synced.
	f, err := os.OpenFile(filepath.Join(dir, "synced"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte(" and this is not"))
	f.Close()
	if b, _ := content(t, filepath.Join(dir, "synced")); string(b) != "kept and this is not" {
		t.Fatalf("before the cut: %q", b)
	}

	rep := cut(t, c, LoseUnsynced)
	if b, ok := content(t, filepath.Join(dir, "synced")); !ok || string(b) != "kept" {
		t.Errorf("synced file after the cut: %q (exists %v), want %q", b, ok, "kept")
	}
	if b, ok := content(t, filepath.Join(dir, "unsynced")); !ok || len(b) != 0 {
		t.Errorf("unsynced file after the cut: %q (exists %v), want an empty file (its entry was synced, its data not)", b, ok)
	}
	if _, ok := content(t, filepath.Join(dir, "no-entry")); ok {
		t.Error("a file whose directory was not synced after its creation survived the cut")
	}
	if rep.UndoneEntries != 1 || rep.UnsyncedFiles != 2 {
		t.Errorf("report %+v: want 1 entry undone and 2 files with unsynced data", rep)
	}
}

// A rename, an unlink and a truncate without fsync are undone.
func TestUnsyncedNamespaceIsUndone(t *testing.T) {
	c := mount(t, 2)
	dir := c.Dir()
	write(t, filepath.Join(dir, "a"), []byte("old a"), true)
	write(t, filepath.Join(dir, "b"), []byte("old b"), true)
	write(t, filepath.Join(dir, "gone"), []byte("removed"), true)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, dir)

	write(t, filepath.Join(dir, "a.tmp"), []byte("new a"), true)
	if err := os.Rename(filepath.Join(dir, "a.tmp"), filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "b"), filepath.Join(dir, "sub", "b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "a"), 2); err != nil {
		t.Fatal(err)
	}

	cut(t, c, LoseUnsynced)
	if b, _ := content(t, filepath.Join(dir, "a")); string(b) != "old a" {
		t.Errorf("a after the cut: %q, want the file the unsynced rename replaced", b)
	}
	if _, ok := content(t, filepath.Join(dir, "a.tmp")); ok {
		t.Error("a.tmp (created, renamed, never in a synced directory) survived")
	}
	if b, _ := content(t, filepath.Join(dir, "b")); string(b) != "old b" {
		t.Errorf("b after the cut: %q, want it back where it was", b)
	}
	if _, ok := content(t, filepath.Join(dir, "sub", "b")); ok {
		t.Error("sub/b: an unsynced move into a directory survived")
	}
	if b, _ := content(t, filepath.Join(dir, "gone")); string(b) != "removed" {
		t.Errorf("an unsynced unlink survived: gone is %q", b)
	}

	// The same, made durable.
	write(t, filepath.Join(dir, "a.tmp"), []byte("new a"), true)
	os.Rename(filepath.Join(dir, "a.tmp"), filepath.Join(dir, "a"))
	os.Remove(filepath.Join(dir, "gone"))
	syncDir(t, dir)
	cut(t, c, LoseUnsynced)
	if b, _ := content(t, filepath.Join(dir, "a")); string(b) != "new a" {
		t.Errorf("a after a synced rename and a cut: %q", b)
	}
	if _, ok := content(t, filepath.Join(dir, "gone")); ok {
		t.Error("a synced unlink was undone")
	}
}

// TornWrite leaves the synced data, then a prefix of what followed.
// Writes are appends here, so every outcome is a prefix of the whole.
func TestTornWrite(t *testing.T) {
	c := mount(t, 3)
	path := filepath.Join(c.Dir(), "log")
	write(t, path, bytes.Repeat([]byte("s"), 100), true)
	syncDir(t, c.Dir())
	torn, full, none := 0, 0, 0
	for round := range 40 {
		whole, _ := content(t, path) // what survived the last cut is durable
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		var added []byte
		for i := range 3 {
			chunk := bytes.Repeat([]byte{byte('a' + i)}, 1000)
			f.Write(chunk)
			added = append(added, chunk...)
		}
		f.Close()
		cut(t, c, TornWrite)
		got, _ := content(t, path)
		want := append(append([]byte(nil), whole...), added...)
		if !bytes.HasPrefix(want, got) || len(got) < len(whole) {
			t.Fatalf("round %d: after a torn cut the file is %d bytes, not a prefix of the %d written after %d synced", round, len(got), len(want), len(whole))
		}
		switch n := len(got) - len(whole); {
		case n == 0:
			none++
		case n == len(added):
			full++
		case n%1000 != 0:
			torn++
		}
	}
	if torn == 0 || full == 0 {
		t.Errorf("40 torn cuts: %d torn inside a write, %d with nothing kept, %d with all kept; want cuts both inside a write and after all of them", torn, none, full)
	}
}

// Reordered lands any subset of the unsynced writes: a later one may
// survive an earlier one, leaving zeros where that one was.
func TestReordered(t *testing.T) {
	c := mount(t, 4)
	path := filepath.Join(c.Dir(), "f")
	laterOnly := 0
	for range 40 {
		write(t, path, nil, true) // empty, and synced
		syncDir(t, c.Dir())
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt(bytes.Repeat([]byte("1"), 4096), 0)
		f.WriteAt(bytes.Repeat([]byte("2"), 4096), 4096)
		f.Close()
		cut(t, c, Reordered)
		got, _ := content(t, path)
		switch {
		case len(got) == 0:
		case len(got) == 4096 && bytes.Equal(got, bytes.Repeat([]byte("1"), 4096)):
		case len(got) == 8192 && bytes.Equal(got[4096:], bytes.Repeat([]byte("2"), 4096)):
			if bytes.Equal(got[:4096], make([]byte, 4096)) {
				laterOnly++
			} else if !bytes.Equal(got[:4096], bytes.Repeat([]byte("1"), 4096)) {
				t.Fatalf("first page is neither written nor a hole: %q…", got[:8])
			}
		default:
			t.Fatalf("after a reordered cut: %d bytes that no subset of the writes gives", len(got))
		}
	}
	if laterOnly == 0 {
		t.Error("40 reordered cuts never kept the second write without the first")
	}
}

// FreezeAt stops the card at an operation: it and what follows never
// take effect, and block until the cut.
func TestFreezeAt(t *testing.T) {
	c := mount(t, 5)
	dir := c.Dir()
	write(t, filepath.Join(dir, "before"), []byte("x"), true)
	syncDir(t, dir)
	c.FreezeAt(func(op Op) bool { return op.Kind == OpRename && op.To == "target" })
	write(t, filepath.Join(dir, "target.tmp"), []byte("y"), true)
	syncDir(t, dir)
	done := make(chan error, 1)
	go func() { done <- os.Rename(filepath.Join(dir, "target.tmp"), filepath.Join(dir, "target")) }()
	select {
	case <-c.Frozen():
	case <-time.After(10 * time.Second):
		t.Fatal("the rename did not freeze the card")
	}
	select {
	case err := <-done:
		t.Fatalf("the rename that froze the card returned (%v) before the cut", err)
	case <-time.After(100 * time.Millisecond):
	}
	if got := c.FrozenAt(); got != "rename target.tmp -> target" {
		t.Errorf("FrozenAt %q", got)
	}
	c.Release()
	if err := <-done; !errors.Is(err, syscall.EIO) {
		t.Errorf("released rename: %v, want EIO", err)
	}
	cut(t, c, LoseUnsynced)
	if _, ok := content(t, filepath.Join(dir, "target")); ok {
		t.Error("the rename that froze the card took effect")
	}
	if b, _ := content(t, filepath.Join(dir, "target.tmp")); string(b) != "y" {
		t.Errorf("target.tmp after the cut: %q", b)
	}
	// Mounted again, the card works and is no longer frozen.
	write(t, filepath.Join(dir, "after"), []byte("z"), true)
}

// bbolt (flock, mmap, pwrite, fdatasync) works on the card, and its
// committed transactions survive a cut once the file's directory entry
// is durable. bbolt runs in a child process: a process must not page
// in a file of a FUSE filesystem it serves itself (a page fault cannot
// be stopped for the garbage collector, which then waits forever).
func TestBoltOnCard(t *testing.T) {
	c := mount(t, 6)
	path := filepath.Join(c.Dir(), "state.db")
	bolt := func(op string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestBoltChild$")
		cmd.Env = append(os.Environ(), "SDCARD_BOLT="+op, "SDCARD_BOLT_PATH="+path)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bolt %s: %v\n%s", op, err, out)
		}
		_, v, _ := strings.Cut(string(out), "value=")
		v, _, _ = strings.Cut(v, "\n")
		return v
	}
	bolt("write")
	cut(t, c, Reordered)
	if v := bolt("read"); v != "committed" && v != "not synced" {
		t.Errorf("after the cut k = %q, want the committed value (or the unsynced one, which a reordered cut may keep)", v)
	}
}

// TestBoltChild is TestBoltOnCard's child process.
func TestBoltChild(t *testing.T) {
	op, path := os.Getenv("SDCARD_BOLT"), os.Getenv("SDCARD_BOLT_PATH")
	if op == "" {
		t.Skip("run by TestBoltOnCard")
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	put := func(k, v string) {
		t.Helper()
		if err := db.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			return b.Put([]byte(k), []byte(v))
		}); err != nil {
			t.Fatal(err)
		}
	}
	switch op {
	case "write":
		syncDir(t, filepath.Dir(path))
		for i := range 200 {
			put("k", strings.Repeat(string(rune('a'+i%26)), 100*i))
		}
		put("k", "committed")
		db.NoSync = true
		put("k", "not synced")
	case "read":
		db.View(func(tx *bbolt.Tx) error {
			fmt.Printf("value=%s\n", tx.Bucket([]byte("b")).Get([]byte("k")))
			return nil
		})
	}
}
