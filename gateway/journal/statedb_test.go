package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgegate/edgegate/aggregate"
)

// stateHistory is a state file written by six checkpoints of an
// aggregator (windows closing, revised by late readings, expiring), with
// what it held after each: the checkpoint and every stored window.
type stateHistory struct {
	dir     string
	cps     map[uint64][]byte                           // checkpoint by seq
	windows map[uint64]map[string]aggregate.WindowState // seq → hex key → window
	cfg     aggregate.Config
}

const historyCommits = 6

func writeHistory(t testing.TB) *stateHistory {
	t.Helper()
	h := &stateHistory{dir: t.TempDir(), cps: map[uint64][]byte{}, windows: map[uint64]map[string]aggregate.WindowState{}}
	h.cfg = aggregate.DefaultConfig()
	h.cfg.MaxRetained = 10
	h.cfg.AllowedLateness = 3 * time.Hour
	db, err := OpenStateDB(filepath.Join(h.dir, "state.db"), StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var now time.Time
	agg, err := aggregate.New(h.cfg, aggregate.WallClock(func() time.Time { return now }), nil)
	if err != nil {
		t.Fatal(err)
	}
	agg.SetStore(db)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	minute := 0
	for seq := uint64(1); seq <= historyCommits; seq++ {
		// 40 minutes of 12 devices × 2 metrics: about 1,000 windows each
		// time, enough for branch pages. The last checkpoint only has
		// late readings: the pages the one before replaced stay free.
		for range 40 {
			if seq == historyCommits {
				break
			}
			now = t0.Add(time.Duration(minute)*time.Minute + 10*time.Second)
			for d := range 12 {
				for _, m := range []string{"temp", "rh"} {
					agg.Add(aggregate.Reading{Device: fmt.Sprintf("dev-%02d", d), Metric: m, Unit: "u", Time: now, Value: float64(minute*100 + d)})
				}
			}
			minute++
		}
		// Late readings revise windows closed by earlier checkpoints.
		for d := range 12 {
			agg.Add(aggregate.Reading{Device: fmt.Sprintf("dev-%02d", d), Metric: "temp", Time: t0.Add(time.Duration(minute-60+d)*time.Minute + time.Second), Value: -1})
		}
		// With persistent sessions, the checkpoint takes overflow pages.
		sessions := map[string]Session{}
		for i := range 200 {
			sessions[fmt.Sprintf("client-%03d", i)] = Session{Proto: 5, Expiry: 3600, Username: "u", Listener: "tcp"}
		}
		c := Checkpoint{Seq: seq, Clock: now.UnixNano(), Snapshot: agg.AppendSnapshot, Sessions: sessions}
		data := c.Encode()
		if _, _, err := db.Commit(seq, data, agg); err != nil {
			t.Fatal(err)
		}
		h.cps[seq] = data
		h.windows[seq] = dumpWindows(t, db)
	}
	return h
}

func dumpWindows(t testing.TB, s *StateDB) map[string]aggregate.WindowState {
	t.Helper()
	out := map[string]aggregate.WindowState{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketWindows).ForEach(func(k, v []byte) error {
			_, w, err := decodeWindowState(k, v)
			if err != nil {
				return fmt.Errorf("window %x: %w", k, err)
			}
			out[hex.EncodeToString(k)] = w
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// copyDir copies the files of h.dir to a new directory.
func (h *stateHistory) copy(t *testing.T) string {
	dir := t.TempDir()
	for _, name := range []string{"state.db", PreviousName} {
		b, err := os.ReadFile(filepath.Join(h.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// openResult is what a child process found opening a damaged state file.
type openResult struct {
	Err      string
	Recovery Recovery
	Seq      uint64 // of the checkpoint in the file, 0: none
	Windows  map[string]aggregate.WindowState
	Reopened Recovery // after a commit and a reopen
}

// TestStateDamageChild is the child of TestStateDamage: for each
// directory listed in $EDGEGATE_STATE_DIRS it opens the state file, writes
// a checkpoint on it, opens it again, and prints what it found, one line
// each, so that the parent knows which one a crash was on.
func TestStateDamageChild(t *testing.T) {
	list := os.Getenv("EDGEGATE_STATE_DIRS")
	if list == "" {
		t.Skip("run by TestStateDamage")
	}
	for _, dir := range strings.Split(list, ",") {
		b, _ := json.Marshal(openDamaged(t, dir))
		fmt.Printf("RESULT %s\n", b)
	}
}

func openDamaged(t *testing.T, dir string) (res openResult) {
	path := filepath.Join(dir, "state.db")
	db, err := OpenStateDB(path, StateOptions{Quarantine: filepath.Join(dir, "quarantine")})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Recovery = db.Recovery()
	if cp, err := db.Checkpoint(); err != nil {
		res.Err = err.Error()
	} else if cp != nil {
		c, err := DecodeCheckpoint(cp)
		if err != nil {
			res.Err = "checkpoint in use: " + err.Error()
			return res
		}
		res.Seq = c.Seq
	}
	res.Windows = dumpWindows(t, db)
	// The file takes a checkpoint and opens clean after it.
	agg, _ := aggregate.New(aggregate.DefaultConfig(), aggregate.WallClock(time.Now), nil)
	if _, _, err := db.Commit(100, (&Checkpoint{Seq: 100}).Encode(), agg); err != nil {
		res.Err = "commit: " + err.Error()
		return res
	}
	db.Close()
	if db, err = OpenStateDB(path, StateOptions{}); err != nil {
		res.Err = "reopen: " + err.Error()
		return res
	}
	res.Reopened = db.Recovery()
	db.Close()
	return res
}

// openInChildren opens each directory's state file in a child process
// (this test binary, TestStateDamageChild), starting a new child after one
// dies. It returns each directory's result, or how its child died.
func openInChildren(t *testing.T, dirs []string) ([]openResult, []string) {
	results, died := make([]openResult, len(dirs)), make([]string, len(dirs))
	for next := 0; next < len(dirs); {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStateDamageChild$", "-test.v")
		cmd.Env = append(os.Environ(), "EDGEGATE_STATE_DIRS="+strings.Join(dirs[next:], ","))
		out, err := cmd.CombinedOutput()
		var rest []string
		for _, l := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(l, "RESULT "); ok {
				if err := json.Unmarshal([]byte(s), &results[next]); err != nil {
					t.Fatal(err)
				}
				next++
				rest = nil
				continue
			}
			rest = append(rest, l)
		}
		if err != nil && next < len(dirs) {
			msg := strings.Join(rest, "\n")
			if len(msg) > 2000 {
				msg = msg[:2000]
			}
			died[next] = fmt.Sprintf("%v:\n%s", err, msg)
			next++
		}
	}
	return results, died
}

// damageCase damages a copy of a state history in dir: b is state.db's
// content, changed in place, pages its pages.
type damageCase struct {
	damage func(t *testing.T, h *stateHistory, dir string, b []byte, pages []StatePage)
	// seq is the checkpoint the state must start from (0: none), windows
	// the checkpoint whose windows the file must hold (0: none), exact
	// whether all of them (else those kept must be right and some are
	// missing), rebuilt whether state.db is written anew.
	seq, windows uint64
	exact        bool
	rebuilt      bool
}

// flip returns a damage that flips a byte at offset off of the first page
// that match selects.
func flip(off int, match func(StatePage) bool) func(*testing.T, *stateHistory, string, []byte, []StatePage) {
	return func(t *testing.T, h *stateHistory, _ string, b []byte, pages []StatePage) {
		for _, p := range pages {
			if match(p) {
				b[int(p.ID)*os.Getpagesize()+off] ^= 0x5a
				return
			}
		}
		t.Fatalf("no page at offset %d like that in the history", off)
	}
}

// flipIn flips a byte in the middle of the given bytes where the file
// holds them (a checkpoint, say).
func flipIn(t *testing.T, b, what []byte) {
	i := bytes.Index(b, what)
	if i < 0 {
		t.Fatal("bytes not in the file")
	}
	b[i+len(what)/2] ^= 0x5a
}

func kind(k, bucket string, cur, prev bool) func(StatePage) bool {
	return func(p StatePage) bool {
		return p.Kind == k && p.Bucket == bucket && p.Current == cur && p.Previous == prev
	}
}

// TestStateDamage damages a real state file (six checkpoints of an
// aggregator, windows closed, revised and expired) one way at a time, in
// every kind of page, and opens it in a child process: the open must not
// crash or fail, and the state must be one that was true: the checkpoint
// of a transaction that was written, with its windows as they were then
// (all of them, when the damage spared them).
func TestStateDamage(t *testing.T) {
	h := writeHistory(t)
	const hdrID, hdrFlags, hdrCount, hdrOverflow = 0, 8, 10, 12
	newest, previous := uint64(historyCommits), uint64(historyCommits-1)
	cases := map[string]damageCase{
		"nothing": {func(*testing.T, *stateHistory, string, []byte, []StatePage) {}, newest, newest, true, false},
		// bbolt itself then uses the other meta page: the transaction before.
		"newest meta page: checksum": {flip(16+56, func(p StatePage) bool { return p.NewestMeta }), previous, previous, true, false},
		"older meta page: checksum":  {flip(16+56, func(p StatePage) bool { return p.Kind == "meta" && !p.NewestMeta }), newest, newest, true, false},
		"both meta pages": {func(t *testing.T, h *stateHistory, _ string, b []byte, _ []StatePage) {
			b[16] ^= 1
			b[os.Getpagesize()+16] ^= 1
		}, previous, 0, false, true},
		// Pages the last checkpoint wrote: the tree before it is whole.
		"root page: header names another page":        {flip(hdrID, kind("leaf", "", true, false)), previous, previous, true, true},
		"root page: type":                             {flip(hdrFlags, kind("leaf", "", true, false)), previous, previous, true, true},
		"windows branch page: element count":          {flip(hdrCount, kind("branch", "windows", true, false)), previous, previous, true, true},
		"windows branch page: a child's page":         {flip(pageHeader+8, kind("branch", "windows", true, false)), previous, previous, true, true},
		"new windows leaf: header names another page": {flip(hdrID, kind("leaf", "windows", true, false)), previous, previous, true, true},
		"new windows leaf: a key's offset":            {flip(pageHeader+4, kind("leaf", "windows", true, false)), previous, previous, true, true},
		"checkpoint leaf: overflow count":             {flip(hdrOverflow, kind("leaf", "meta", true, false)), previous, previous, true, true},
		"checkpoint overflow page":                    {flip(100, kind("overflow", "meta", true, false)), previous, previous, true, true},
		"newest checkpoint fails its checksum": {func(t *testing.T, h *stateHistory, _ string, b []byte, _ []StatePage) {
			flipIn(t, b, h.cps[newest])
		}, previous, previous, true, true},
		// Pages both trees share: their windows are lost, the rest kept.
		"shared windows branch page: type":    {flip(hdrFlags, kind("branch", "windows", true, true)), newest, newest, false, true},
		"shared windows leaf: type":           {flip(hdrFlags, kind("leaf", "windows", true, true)), newest, newest, false, true},
		"shared windows leaf: element count":  {flip(hdrCount, kind("leaf", "windows", true, true)), newest, newest, false, true},
		"shared windows leaf: a value's size": {flip(pageHeader+12, kind("leaf", "windows", true, true)), newest, newest, false, true},
		"shared windows leaf: a stored value": {flip(os.Getpagesize()/4, kind("leaf", "windows", true, true)), newest, newest, false, true},
		// Pages bbolt does not read.
		"free page":                 {flip(hdrFlags, kind("free", "", false, false)), newest, newest, true, false},
		"page of the previous tree": {flip(hdrID, kind("leaf", "windows", false, true)), newest, newest, true, false},
		// Both checkpoints in state.db: checkpoint.prev, with the windows
		// (those the newest checkpoint wrote are ahead of it).
		"both checkpoints in state.db": {func(t *testing.T, h *stateHistory, _ string, b []byte, _ []StatePage) {
			flipIn(t, b, h.cps[newest])
			flipIn(t, b, h.cps[previous])
		}, previous, newest, true, true},
		"state.db truncated to one page": {func(t *testing.T, _ *stateHistory, dir string, b []byte, _ []StatePage) {
			if err := os.Truncate(filepath.Join(dir, "state.db"), int64(os.Getpagesize())); err != nil {
				t.Fatal(err)
			}
		}, previous, 0, false, true},
		"checkpoint.prev only": {func(t *testing.T, _ *stateHistory, dir string, _ []byte, _ []StatePage) {
			damageFile(t, filepath.Join(dir, PreviousName))
		}, newest, newest, true, false},
		// Nothing left: the journal alone.
		"every checkpoint": {func(t *testing.T, h *stateHistory, dir string, b []byte, _ []StatePage) {
			flipIn(t, b, h.cps[newest])
			flipIn(t, b, h.cps[previous])
			damageFile(t, filepath.Join(dir, PreviousName))
		}, 0, 0, false, true},
	}
	pages, err := StatePages(filepath.Join(h.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(h.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(cases))
	var dirs []string
	for _, name := range names {
		dir := h.copy(t)
		b := bytes.Clone(orig)
		cases[name].damage(t, h, dir, b, pages)
		if name != "state.db truncated to one page" {
			if err := os.WriteFile(filepath.Join(dir, "state.db"), b, 0o640); err != nil {
				t.Fatal(err)
			}
		}
		dirs = append(dirs, dir)
	}
	results, died := openInChildren(t, dirs)
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			c, res := cases[name], results[i]
			if died[i] != "" {
				t.Fatalf("the process died opening the state file: %s", died[i])
			}
			if res.Err != "" {
				t.Fatal(res.Err)
			}
			rec := res.Recovery
			if res.Seq != c.seq {
				t.Errorf("state from checkpoint %d, want %d (%+v)", res.Seq, c.seq, rec)
			}
			want := h.windows[c.windows]
			wrong := 0
			for k, w := range res.Windows {
				if want[k] != w {
					wrong++
				}
			}
			switch {
			case wrong > 0:
				t.Errorf("%d of %d windows are not as they were at checkpoint %d", wrong, len(res.Windows), c.windows)
			case c.exact && len(res.Windows) != len(want):
				t.Errorf("%d windows, want all %d of checkpoint %d", len(res.Windows), len(want), c.windows)
			case !c.exact && (len(res.Windows) >= len(want) && len(want) > 0 || !rec.WindowsLost):
				t.Errorf("%d windows of %d, lost %v: want some lost, and said so", len(res.Windows), len(want), rec.WindowsLost)
			}
			if rec.Rebuilt != c.rebuilt || c.exact && rec.WindowsLost {
				t.Errorf("rebuilt %v, lost %v; want %v, %v (%+v)", rec.Rebuilt, rec.WindowsLost, c.rebuilt, !c.exact, rec)
			}
			if c.rebuilt && len(rec.Quarantined) == 0 {
				t.Errorf("the damaged file was not kept in quarantine: %+v", rec)
			}
			if (rec.Damage != "") != (name != "nothing" && name != "free page" && name != "page of the previous tree" && name != "older meta page: checksum" && name != "newest meta page: checksum") {
				t.Errorf("damage reported: %q", rec.Damage)
			}
			if res.Reopened.Damage != "" || res.Reopened.Rebuilt {
				t.Errorf("after a checkpoint, the state file opens damaged again: %+v", res.Reopened)
			}
		})
	}
}

// damageFile flips a byte in the middle of the file at path.
func damageFile(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x5a
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// TestWindowValue: a stored window carries the checkpoint that wrote it
// and a checksum over its key and value; values written before (version
// 1, no checksum) still read.
func TestWindowValue(t *testing.T) {
	w := aggregate.WindowState{Start: 60e9, Count: 3, Min: -1, Max: 2.5, Sum: 4, Mean: 4.0 / 3, M2: 0.25, FirstT: 61e9, LastT: 62e9,
		First: 2.5, Last: -1, Late: 1, Revision: 2, Unit: "Cel"}
	key := windowKey(nil, "dev", "temp", w.Start)
	v := appendWindowState(nil, key, 42, w)
	tag, got, err := decodeWindowState(key, v)
	if err != nil || tag != 42 || got != w {
		t.Fatalf("round trip: %d %+v %v", tag, got, err)
	}
	for i := range v {
		c := bytes.Clone(v)
		c[i] ^= 0x10
		if _, _, err := decodeWindowState(key, c); err == nil {
			t.Errorf("a flipped byte %d of the value is not detected", i)
		}
	}
	if _, _, err := decodeWindowState(windowKey(nil, "dew", "temp", w.Start), v); err == nil {
		t.Error("a value under another key is not detected")
	}
	// Versions 1 and 2: without the readings by timing (read as all
	// stamped by their devices), and version 1 without the tag and the
	// checksum too. The timings are the last four varints before the
	// checksum, each one byte here but the first (Count, 3: one byte too).
	w.DeviceTimed = 3
	v = appendWindowState(nil, key, 42, w)
	fields := v[2 : len(v)-4-4]
	v1 := append([]byte{1}, fields...)
	if tag, got, err := decodeWindowState(key, v1); err != nil || tag != 0 || got != w {
		t.Errorf("version 1: %d %+v %v", tag, got, err)
	}
	v2 := append([]byte{2, 42}, fields...)
	v2 = binary.LittleEndian.AppendUint32(v2, crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, v2))
	if tag, got, err := decodeWindowState(key, v2); err != nil || tag != 42 || got != w {
		t.Errorf("version 2: %d %+v %v", tag, got, err)
	}
}

// TestPreviousCheckpoint: each commit first keeps the checkpoint it
// replaces in checkpoint.prev; a write of it that a crash interrupted
// leaves the one before; a lost state.db is rebuilt from it.
func TestPreviousCheckpoint(t *testing.T) {
	dir := t.TempDir()
	path, prev := filepath.Join(dir, "state.db"), filepath.Join(dir, PreviousName)
	db, err := OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agg, _ := aggregate.New(aggregate.DefaultConfig(), aggregate.WallClock(time.Now), nil)
	for seq := uint64(1); seq <= 3; seq++ {
		if _, _, err := db.Commit(seq, testCheckpoint(seq), agg); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(prev)
		switch {
		case seq == 1 && !os.IsNotExist(err):
			t.Errorf("after the first checkpoint, %s exists (%v)", PreviousName, err)
		case seq > 1 && !bytes.Equal(b, testCheckpoint(seq-1)):
			t.Errorf("after checkpoint %d, %s = %q, %v; want checkpoint %d", seq, PreviousName, b, err, seq-1)
		}
	}
	db.Close()
	// A crash in the middle of the next write: the temporary file is
	// left, never renamed.
	if err := os.WriteFile(prev+".tmp", []byte("EGCP half"), 0o640); err != nil {
		t.Fatal(err)
	}
	db, err = OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec := db.Recovery(); rec.Damage != "" || rec.From != "state.db" || rec.Seq != 3 {
		t.Errorf("recovery %+v, want checkpoint 3 from state.db", rec)
	}
	if _, err := os.Stat(prev + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("leftover %s.tmp not removed: %v", PreviousName, err)
	}
	// A second commit after a restart does not write checkpoint.prev
	// again for the same checkpoint.
	if _, _, err := db.Commit(4, testCheckpoint(4), agg); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if b, _ := os.ReadFile(prev); !bytes.Equal(b, testCheckpoint(3)) {
		t.Errorf("%s = %q, want checkpoint 3", PreviousName, b)
	}
	// state.db lost: rebuilt from checkpoint.prev.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	db, err = OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec := db.Recovery()
	if cp, _ := db.Checkpoint(); !bytes.Equal(cp, testCheckpoint(3)) || !rec.Rebuilt || rec.From != PreviousName || !rec.WindowsLost {
		t.Errorf("state.db lost: checkpoint %q, recovery %+v; want checkpoint 3 from %s", cp, rec, PreviousName)
	}
}

// TestMarkLost: once the state file says windows before a time may be
// lost, a window before it that is not found is an error (the reading is
// refused, not made a revision 0), across restarts; one after it is
// simply not found.
func TestMarkLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.Load("d", "m", 0); ok || err != nil {
		t.Errorf("nothing stored: %v %v", ok, err)
	}
	if err := db.MarkLost(60e9); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if rec := db.Recovery(); rec.Damage != "" {
		t.Errorf("reopened: %+v", rec)
	}
	if _, ok, err := db.Load("d", "m", 0); ok || err == nil {
		t.Errorf("window before the bound: found %v, err %v; want an error", ok, err)
	}
	if _, ok, err := db.Load("d", "m", 60e9); ok || err != nil {
		t.Errorf("window at the bound: found %v, err %v; want not found", ok, err)
	}
}

// TestQuarantineBounded: damaged state files are kept in quarantine, at
// most maxQuarantinedState of them.
func TestQuarantineBounded(t *testing.T) {
	dir := t.TempDir()
	path, qdir := filepath.Join(dir, "state.db"), filepath.Join(dir, "quarantine")
	for i := range maxQuarantinedState + 2 {
		if err := os.WriteFile(path, bytes.Repeat([]byte{byte(i)}, 3*os.Getpagesize()), 0o640); err != nil {
			t.Fatal(err)
		}
		db, err := OpenStateDB(path, StateOptions{Quarantine: qdir})
		if err != nil {
			t.Fatal(err)
		}
		rec := db.Recovery()
		db.Close()
		if kept := i < maxQuarantinedState; kept != (len(rec.Quarantined) == 1) || !rec.Rebuilt {
			t.Errorf("damaged file %d: %+v", i, rec)
		}
	}
	if kept, _ := os.ReadDir(qdir); len(kept) != maxQuarantinedState {
		t.Errorf("%d files in quarantine, want %d", len(kept), maxQuarantinedState)
	}
}

// TestAheadWindows: when the state starts from checkpoint.prev, the
// windows the newest checkpoint wrote are kept but refused to the replay
// until it has passed that checkpoint (they already hold its events), also
// after a restart before the next commit; after the replay, or that
// commit, they are used as stored.
func TestAheadWindows(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	db, err := OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	cfg := aggregate.DefaultConfig()
	agg, _ := aggregate.New(cfg, aggregate.WallClock(func() time.Time { return now }), nil)
	agg.SetStore(db)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	add := func(at time.Time, v float64) {
		agg.Add(aggregate.Reading{Device: "d", Metric: "m", Time: at, Value: v})
	}
	now = t0.Add(10 * time.Second)
	add(now, 1)
	now = t0.Add(70 * time.Second)
	add(now, 2) // closes minute 0
	cps := map[uint64][]byte{}
	commit := func(seq uint64) {
		cps[seq] = (&Checkpoint{Seq: seq, Clock: now.UnixNano(), Snapshot: agg.AppendSnapshot}).Encode()
		if _, _, err := db.Commit(seq, cps[seq], agg); err != nil {
			t.Fatal(err)
		}
	}
	commit(10)
	now = t0.Add(130 * time.Second)
	add(now, 3)                    // closes minute 1
	add(t0.Add(20*time.Second), 4) // revises minute 0
	commit(20)
	db.Close()

	b, _ := os.ReadFile(path)
	for _, cp := range cps {
		flipIn(t, b, cp)
	}
	os.WriteFile(path, b, 0o640)
	var pos uint64
	open := func() *StateDB {
		db, err := OpenStateDB(path, StateOptions{Position: func() uint64 { return pos }})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db = open()
	if rec := db.Recovery(); rec.From != PreviousName || rec.Seq != 10 || rec.WindowsAhead != 2 || rec.WindowsKept != 2 || rec.WindowsLost {
		t.Fatalf("recovery %+v; want checkpoint 10 from %s, both windows kept, ahead of it", rec, PreviousName)
	}
	load := func(db *StateDB, minute int) (aggregate.WindowState, bool, error) {
		return db.Load("d", "m", t0.Add(time.Duration(minute)*time.Minute).UnixNano())
	}
	check := func(db *StateDB, at uint64, wantRefused bool) {
		t.Helper()
		pos = at
		w, ok, err := load(db, 0)
		if wantRefused != (err != nil) || !wantRefused && (!ok || w.Count != 2 || w.Sum != 5) {
			t.Errorf("replay at %d: minute 0 = %+v, %v, %v; refused: want %v", at, w, ok, err, wantRefused)
		}
	}
	check(db, 11, true)
	check(db, 20, true) // the checkpoint's own event is in it
	check(db, 21, false)
	db.Close()
	db = open() // a restart before the next commit: still ahead
	if rec := db.Recovery(); rec.Damage != "" || rec.Rebuilt {
		t.Errorf("reopened: %+v", rec)
	}
	check(db, 15, true)
	db.EndReplay()
	check(db, 15, false)
	if _, _, err := db.Commit(30, testCheckpoint(30), agg); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = open()
	defer db.Close()
	check(db, 15, false) // the commit ended it for good
}
