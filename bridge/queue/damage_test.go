package queue

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDamagedSealedTailKeepsItsPrefix: power lost just after a segment
// roll leaves the sealed segment with a durable prefix and a torn tail.
// Every reader, not only the first, must get the prefix: the first used to
// move the whole file to quarantine/ (the forwarder's start-up reads the
// last record before delivering anything, so the prefix was never sent).
func TestDamagedSealedTailKeepsItsPrefix(t *testing.T) {
	const n, segBytes = 300, 2048
	dir := t.TempDir()
	fill(t, dir, n, segBytes)
	segs := segments(t, dir)
	next, _ := parseSegName(filepath.Base(segs[2]))
	cutAt := frameOffset(t, segs[1], next-2) + 5 // inside the second last frame
	if err := os.Truncate(segs[1], cutAt); err != nil {
		t.Fatal(err)
	}
	l, err := Open(dir, Options{SegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := fmt.Sprint(append(seqs(1, next-3), seqs(next, n)...))
	for pass := 1; pass <= 2; pass++ {
		if got := fmt.Sprint(readAll(t, l, 1)); got != want {
			t.Fatalf("pass %d read\n %s\nwant\n %s", pass, got, want)
		}
	}
	if st := l.Stats(); st.Lost != 2 || st.Quarantined != 1 {
		t.Errorf("lost %d quarantined %d, want 2 and 1 (counted once, not per reader)", st.Lost, st.Quarantined)
	}
	if _, err := os.Stat(segs[1]); err != nil {
		t.Errorf("the damaged segment is gone: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "quarantine", filepath.Base(segs[1]))); err != nil || fi.Size() != cutAt {
		t.Errorf("quarantine copy: %v, %v; want the damaged file as found (%d bytes)", fi, err, cutAt)
	}
}

// TestNoAppendAfterRestart: after a restart nothing is appended to the
// segment that was active, whose pages may have come from the page cache
// after a failed fsync (fsyncgate): a new segment is started.
func TestNoAppendAfterRestart(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 20, 1<<20)
	segs := segments(t, dir)
	before, _ := os.Stat(segs[0])
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := l.Append(rec(21)); err != nil || seq != 21 {
		t.Fatalf("Append = %d, %v", seq, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(segs[0])
	if after.Size() != before.Size() {
		t.Errorf("the old active segment grew from %d to %d bytes", before.Size(), after.Size())
	}
	if got := segments(t, dir); len(got) != 2 || filepath.Base(got[1]) != segName(21) {
		t.Errorf("segments %v, want a new one starting at 21", got)
	}
	l, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := fmt.Sprint(readAll(t, l, 1)); got != fmt.Sprint(seqs(1, 21)) {
		t.Errorf("read %s", got)
	}
}

// TestConcurrentSyncs: a Sync that starts while another is fsyncing must
// not return before that one's files are durable (the forwarder's
// prefetch and a checkpoint both call Sync; the second used to find
// nothing left to do and return at once).
func TestConcurrentSyncs(t *testing.T) {
	l, err := Open(t.TempDir(), Options{SegmentBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := uint64(1); i <= 50; i++ { // several segments sealed, unsynced
		if _, err := l.Append(rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := make(chan struct{}), make(chan struct{})
	testHookSyncing = func() {
		testHookSyncing = nil
		close(entered)
		<-release
	}
	defer func() { testHookSyncing = nil }()
	firstDone := make(chan error, 1)
	go func() { firstDone <- l.Sync() }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Sync did not reach the fsyncs")
	}
	secondDone := make(chan error, 1)
	go func() { secondDone <- l.Sync() }()
	select {
	case err := <-secondDone:
		t.Errorf("second Sync returned (%v) while the first was still fsyncing", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-secondDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second Sync never returned")
	}
}
