package queue

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
)

const metaFile = "meta"

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

// SetPosition durably records a consumer position: write a temporary file,
// fsync it, rename it over the old one, fsync the directory.
func (l *Log) SetPosition(pos uint64) error {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], pos)
	b := appendFrame(nil, 0, p[:])
	tmp := filepath.Join(l.dir, metaFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write queue position: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write queue position: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync queue position: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write queue position: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(l.dir, metaFile)); err != nil {
		return fmt.Errorf("replace queue position: %w", err)
	}
	return syncDir(l.dir)
}
