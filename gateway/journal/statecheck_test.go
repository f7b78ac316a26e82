package journal

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
)

// smallState writes a state file of commits checkpoints of ten devices
// and ten minutes each (three are enough for a branch page), and returns
// its path.
func smallState(t testing.TB, commits int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := OpenStateDB(path, StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var now time.Time
	agg, _ := aggregate.New(aggregate.DefaultConfig(), aggregate.WallClock(func() time.Time { return now }), nil)
	agg.SetStore(db)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for seq := uint64(1); seq <= uint64(commits); seq++ {
		for m := range 10 {
			now = t0.Add(time.Duration(int(seq)*10+m)*time.Minute + 10*time.Second)
			for _, dev := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
				agg.Add(aggregate.Reading{Device: dev, Metric: "temp", Time: now, Value: float64(m)})
			}
		}
		if _, _, err := db.Commit(seq, (&Checkpoint{Seq: seq, Clock: now.UnixNano(), Snapshot: agg.AppendSnapshot}).Encode(), agg); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// TestStatePages: the pages of a state file as its two latest
// transactions reach them; a damaged one is an error, not a panic.
func TestStatePages(t *testing.T) {
	path := smallState(t, 3)
	pages, err := StatePages(path)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var leaves []StatePage
	for _, p := range pages {
		switch {
		case p.Kind == "meta":
			if p.NewestMeta {
				count["newest meta"]++
			}
		case p.Current && p.Kind == "leaf" && p.Bucket == "":
			count["root"]++
		case p.Current && p.Kind == "leaf" && p.Bucket == "meta":
			count["checkpoint"]++
		case p.Current && p.Kind == "branch" && p.Bucket == "windows":
			count["windows branch"]++
		case p.Current && p.Kind == "leaf" && p.Bucket == "windows":
			leaves = append(leaves, p)
			if p.Previous {
				count["shared windows leaf"]++
			} else {
				count["new windows leaf"]++
			}
		}
	}
	for _, k := range []string{"newest meta", "root", "checkpoint", "windows branch"} {
		if count[k] != 1 {
			t.Errorf("%d pages %s, want 1 (%v)", count[k], k, count)
		}
	}
	if count["shared windows leaf"] == 0 || count["new windows leaf"] == 0 {
		t.Errorf("windows leaves: %v; want some the last checkpoint wrote, and some it did not", count)
	}
	for _, p := range leaves {
		if bytes.Compare(p.First, p.Last) > 0 {
			t.Errorf("page %d: first key after its last", p.ID)
		}
		for _, q := range leaves {
			if p.ID != q.ID && bytes.Compare(p.First, q.Last) <= 0 && bytes.Compare(q.First, p.Last) <= 0 {
				t.Errorf("pages %d and %d hold overlapping keys", p.ID, q.ID)
			}
		}
	}
	b, _ := os.ReadFile(path)
	for _, p := range pages {
		if p.Current && p.Kind == "leaf" && p.Bucket == "" {
			b[int(p.ID)*os.Getpagesize()+8] ^= 0x5a // its type
		}
	}
	os.WriteFile(path, b, 0o640)
	if _, err := StatePages(path); err == nil {
		t.Error("a damaged root page is not an error")
	}
}

// tinyState is a small state file (one checkpoint of a hundred windows)
// without its unused tail.
func tinyState(t testing.TB) []byte {
	b, err := os.ReadFile(smallState(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	ps, n := os.Getpagesize(), 0
	for i := len(b) / ps; i > 0 && n == 0; i-- {
		if !bytes.Equal(b[(i-1)*ps:i*ps], make([]byte, ps)) {
			n = i
		}
	}
	return b[:n*ps]
}

// decide is what OpenStateDB decides about a state file and a previous
// checkpoint, and the walk a rebuild then makes.
func decide(t *testing.T, file, prev []byte) {
	var p *prevCheckpoint
	if seq, err := checkpointSeq(prev); err == nil {
		p = &prevCheckpoint{data: prev, seq: seq}
	}
	var rec Recovery
	plan := planState(bytes.NewReader(file), int64(len(file)), p, &rec)
	if plan.inPlace != (rec.Damage == "") && len(file) > 0 {
		t.Errorf("in place %v, damage %q", plan.inPlace, rec.Damage)
	}
	if plan.source >= 0 && plan.file != nil {
		plan.file.walk(plan.file.metas[plan.source], func(_, k, v []byte) { checkWindowState(k, v) })
	}
}

// TestStateFileRandomDamage: a few thousand random damages (1–4 bytes
// each, a fixed seed) of a small state file; none makes the check panic.
func TestStateFileRandomDamage(t *testing.T) {
	b := tinyState(t)
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		c := bytes.Clone(b)
		for range 1 + r.IntN(4) {
			c[r.IntN(len(c))] ^= byte(1 + r.IntN(255))
		}
		decide(t, c, nil)
	}
}

// FuzzStateFile: whatever the bytes of a state file and of a previous
// checkpoint, deciding what to make of them neither panics nor reads
// outside the file.
func FuzzStateFile(f *testing.F) {
	b := tinyState(f)
	f.Add(b, testCheckpoint(1))
	f.Add(b[:2*os.Getpagesize()], []byte(nil))
	f.Fuzz(decide)
}
