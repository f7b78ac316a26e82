package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/edgegate/edgegate/aggregate"
)

// StateDB is the gateway's state on disk, <data_dir>/state/state.db (a
// bbolt B+tree file): the latest checkpoint and the closed windows kept
// for late revisions. Both change in one transaction per checkpoint, so
// they always describe the same moment of the journal. Between
// checkpoints nothing is written; the aggregator reads windows it does not
// hold in RAM (Load).
type StateDB struct {
	db   *bolt.DB
	Path string
}

var (
	bucketMeta    = []byte("meta")
	bucketWindows = []byte("windows")
	keyCheckpoint = []byte("checkpoint")
)

// OpenStateDB opens (or creates) the state file. A file bbolt cannot open
// as a database is set aside (renamed *.damaged) and a new one started:
// the gateway never refuses to start because of its own files.
func OpenStateDB(path string, log *slog.Logger) (*StateDB, error) {
	opts := &bolt.Options{Timeout: 2 * time.Second, FreelistType: bolt.FreelistMapType, NoFreelistSync: true}
	db, err := bolt.Open(path, 0o640, opts)
	if err != nil && !errors.Is(err, berrors.ErrTimeout) && !errors.Is(err, os.ErrPermission) {
		aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
		log.Error("state file unreadable; set aside, starting from the journal alone", "file", path, "moved_to", aside, "err", err)
		if rerr := os.Rename(path, aside); rerr == nil {
			db, err = bolt.Open(path, 0o640, opts)
		}
	}
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open state %s: locked by another process (is another edgegate running on this data_dir?)", path)
		}
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketWindows} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	// A new (or set-aside) state file's directory entry is durable only
	// once its directory is.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("init state %s: fsync directory: %w", path, err)
		}
	}
	return &StateDB{db: db, Path: path}, nil
}

// Close closes the state file.
func (s *StateDB) Close() error { return s.db.Close() }

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

// Commit writes a checkpoint with the aggregator's changed windows and
// deletes the windows past their horizon, in one transaction (fsynced).
func (s *StateDB) Commit(cp []byte, agg *aggregate.Aggregator) (written, deleted int, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketWindows)
		var perr error
		agg.TakeDirty(func(dev, metric string, w aggregate.WindowState) {
			// bbolt keeps key and value until the commit: no reuse.
			if err := b.Put(windowKey(nil, dev, metric, w.Start), appendWindowState(nil, w)); err != nil && perr == nil {
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
		return tx.Bucket(bucketMeta).Put(keyCheckpoint, cp)
	})
	return written, deleted, err
}

// Load implements aggregate.Store. A panic from a damaged page is turned
// into an error (the reading is then counted as late_state_evicted).
func (s *StateDB) Load(dev, metric string, start int64) (w aggregate.WindowState, found bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("read state %s: %v", s.Path, r)
		}
	}()
	key := windowKey(nil, dev, metric, start)
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketWindows).Get(key)
		if v == nil {
			return nil
		}
		var derr error
		w, derr = decodeWindowState(v)
		found = derr == nil
		return derr
	})
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

func appendWindowState(b []byte, w aggregate.WindowState) []byte {
	b = append(b, 2) // version: 2 added the readings by timing
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
	return b
}

var errWindowState = errors.New("undecodable stored window")

func decodeWindowState(v []byte) (aggregate.WindowState, error) {
	r := reader{b: v, ok: true}
	var w aggregate.WindowState
	version := r.byte()
	if version != 1 && version != 2 {
		return w, errWindowState
	}
	w.Start, w.Count = r.varint(), r.varint()
	for _, f := range [...]*float64{&w.Min, &w.Max, &w.Sum, &w.Mean, &w.M2, &w.First, &w.Last} {
		if len(r.b) < 8 {
			return w, errWindowState
		}
		*f = math.Float64frombits(binary.LittleEndian.Uint64(r.b))
		r.b = r.b[8:]
	}
	w.FirstT, w.LastT, w.Late = r.varint(), r.varint(), r.varint()
	w.Revision = int(r.varint())
	w.Unit = string(r.bytes())
	if version == 2 {
		w.DeviceTimed, w.Replaced, w.Rebased, w.Unverified = r.varint(), r.varint(), r.varint(), r.varint()
	} else {
		w.DeviceTimed = w.Count // before timings: taken as the devices' times
	}
	if !r.ok || len(r.b) != 0 {
		return w, errWindowState
	}
	return w, nil
}
