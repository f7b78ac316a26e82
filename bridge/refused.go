package bridge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/edgegate/edgegate/bridge/queue"
)

// refusedDir is where, under the outbound queue's directory, the records
// set aside are kept: a queue.Log of their own, bounded by
// Options.RefusedMaxBytes (the oldest are dropped beyond it, counted).
// Each frame is
//
//	version (1 byte, 1)
//	uvarint seq: the record's position in the outbound queue
//	uvarint time it was set aside, Unix nanoseconds
//	reason: uvarint length + bytes
//	the record, encoded as in the outbound queue (record.go), zero mark
const refusedDir = "refused"

const refusedVersion = 1

// RefusedRecord is a record that Kafka refused for good, or that was over
// Options.MaxRecordBytes, and was set aside instead of being delivered.
type RefusedRecord struct {
	Seq    uint64    // its position in the outbound queue
	At     time.Time // when it was set aside
	Reason string
	Record Record
}

// setAside keeps rec (at position seq of the queue) in the refused store,
// durably, and counts it; delivery then goes on past it. A record the
// store cannot hold (over RefusedMaxBytes by itself) is counted as
// dropped. Only a failed write or fsync is an error (ErrQueueFailed).
func (f *Forwarder) setAside(rec Record, seq uint64, reason string) error {
	b := []byte{refusedVersion}
	b = binary.AppendUvarint(b, seq)
	b = binary.AppendUvarint(b, uint64(time.Now().UnixNano()))
	b = appendBytes(b, []byte(reason))
	b = encodeRecord(b, rec, Mark{})
	kept := true
	for {
		_, err := f.refused.Append(b)
		if err == nil {
			break
		}
		if errors.Is(err, queue.ErrFull) {
			n, derr := f.refused.DropFirst()
			if derr != nil {
				return fmt.Errorf("%w: refused store: %w", ErrQueueFailed, derr)
			}
			if n > 0 {
				f.mu.Lock()
				f.stats.RefusedDropped += n
				f.mu.Unlock()
				f.log.Warn("refused store full: oldest records set aside dropped", "records", n, "max_bytes", f.opts.RefusedMaxBytes)
				continue
			}
		}
		if errors.Is(err, queue.ErrFull) || errors.Is(err, queue.ErrTooLarge) {
			kept = false
			break
		}
		return fmt.Errorf("%w: refused store: %w", ErrQueueFailed, err)
	}
	if err := f.refused.Sync(); err != nil {
		return fmt.Errorf("%w: refused store: %w", ErrQueueFailed, err)
	}
	f.mu.Lock()
	f.stats.Refused++
	if !kept {
		f.stats.RefusedDropped++
	}
	f.mu.Unlock()
	f.log.Warn("outbound record refused; set aside, delivery goes on", "topic", rec.Topic, "key", string(rec.Key),
		"seq", seq, "bytes", rec.Size(), "reason", reason, "kept", kept)
	return nil
}

// ReadRefused calls fn for each record set aside that is still in the
// refused store, oldest first. It may run while Run does.
func (f *Forwarder) ReadRefused(fn func(RefusedRecord) error) error {
	r := f.refused.NewReader(f.refused.Stats().First)
	defer r.Close()
	intern := interner{}
	for {
		_, data, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read refused store: %w", err)
		}
		rr, err := decodeRefused(data, intern)
		if err != nil {
			return fmt.Errorf("read refused store: %w", err)
		}
		if err := fn(rr); err != nil {
			return err
		}
	}
}

func decodeRefused(b []byte, intern interner) (RefusedRecord, error) {
	var rr RefusedRecord
	if len(b) == 0 || b[0] != refusedVersion {
		return rr, errRecord
	}
	b = b[1:]
	seq, k := binary.Uvarint(b)
	if k <= 0 {
		return rr, errRecord
	}
	b = b[k:]
	at, k := binary.Uvarint(b)
	if k <= 0 {
		return rr, errRecord
	}
	b = b[k:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return rr, errRecord
	}
	rr.Seq, rr.At, rr.Reason = seq, time.Unix(0, int64(at)), string(b[k:k+int(n)])
	var err error
	rr.Record, err = decodeRecord(b[k+int(n):], intern)
	return rr, err
}
