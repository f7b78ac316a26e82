package queue

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	metaFile = "meta"
	idFile   = "id"
)

// ID returns the log's identity: random, made when the directory was first
// used. Positions stored elsewhere (in Kafka) carry it, so that a log that
// was wiped and started again from sequence 1 is never mistaken for the old
// one.
func (l *Log) ID() string { return l.id }

// loadID reads the log's identity, creating it on first use.
func loadID(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, idFile))
	if id := strings.TrimSpace(string(b)); err == nil && len(id) == 32 {
		return id, nil
	}
	var r [16]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	if err := WriteFileAtomic(dir, idFile, []byte(id+"\n")); err != nil {
		return "", err
	}
	return id, nil
}

// WriteFileAtomic replaces dir/name with data: write a temporary file,
// fsync it, rename it over the old one, fsync the directory. A crash at
// any point leaves either the old file or the new one.
func WriteFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("replace %s: %w", name, err)
	}
	return syncDir(dir)
}

// Position returns the consumer position stored with SetPosition, or 0 when
// none is stored or the metadata is unreadable (then records are delivered
// again, never lost).
func (l *Log) Position() uint64 {
	b, err := os.ReadFile(filepath.Join(l.dir, metaFile))
	if err != nil {
		return 0
	}
	p, _, err := parseFrame(b, 0, 0)
	if err != nil || len(p) != 8 {
		l.log.Warn("queue: metadata unreadable; starting from the beginning", "dir", l.dir, "err", err)
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

// SetPosition durably records a consumer position (atomically, see
// WriteFileAtomic). The segments are synced first: the directory fsync
// that makes the new metadata durable also makes every segment's entry
// durable, and a segment must never be there while the one sealed
// before it still has writes in flight (a power cut would leave a gap
// in the sealed one with records after it, in the new one).
func (l *Log) SetPosition(pos uint64) error {
	if err := l.Sync(); err != nil {
		return fmt.Errorf("store queue position: %w", err)
	}
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], pos)
	if err := WriteFileAtomic(l.dir, metaFile, appendFrame(nil, 0, p[:])); err != nil {
		return fmt.Errorf("store queue position: %w", err)
	}
	return nil
}
