package queue

import (
	"context"
	"sync"
)

// Committer batches records from many goroutines into one append and one
// fsync (group commit): while one batch is being synced, the next one
// fills. Run owns the flushing goroutine.
type Committer struct {
	log  *Log
	mu   sync.Mutex
	cur  *batch
	wake chan struct{}
	err  error // sticky: the log failed, or Run ended
}

type batch struct {
	recs  [][]byte
	done  chan struct{}
	first uint64
	err   error
}

// NewCommitter returns a Committer for l. Call Run before Commit.
func NewCommitter(l *Log) *Committer {
	return &Committer{log: l, cur: &batch{done: make(chan struct{})}, wake: make(chan struct{}, 1)}
}

// Commit appends rec and returns once it is durable, with its sequence
// number. rec must not change until Commit returns. A non-nil error means
// the record must not be acknowledged (ErrFull, or a failed log: stop).
func (c *Committer) Commit(rec []byte) (uint64, error) {
	b, i, err := c.add(rec)
	if err != nil {
		return 0, err
	}
	<-b.done
	if b.err != nil {
		return 0, b.err
	}
	return b.first + uint64(i), nil
}

// Enqueue appends a copy of rec in the next batch without waiting for it to
// be durable (for best-effort input). It reports only a log that has
// already failed.
func (c *Committer) Enqueue(rec []byte) error {
	_, _, err := c.add(append([]byte(nil), rec...))
	return err
}

func (c *Committer) add(rec []byte) (*batch, int, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, 0, c.err
	}
	b := c.cur
	i := len(b.recs)
	b.recs = append(b.recs, rec)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return b, i, nil
}

// Run flushes batches until ctx is cancelled, then flushes what is pending
// and returns. It returns the log's error if a write or fsync fails; every
// waiting and later Commit gets that error.
func (c *Committer) Run(ctx context.Context) error {
	for {
		select {
		case <-c.wake:
		case <-ctx.Done():
			err := c.flush()
			c.mu.Lock()
			if c.err == nil {
				c.err = ErrClosed
			}
			b := c.cur
			c.mu.Unlock()
			if len(b.recs) > 0 { // raced in after the last flush
				b.err = ErrClosed
				close(b.done)
			}
			return err
		}
		if err := c.flush(); err != nil {
			return err
		}
	}
}

func (c *Committer) flush() error {
	c.mu.Lock()
	b := c.cur
	if len(b.recs) == 0 {
		c.mu.Unlock()
		return nil
	}
	c.cur = &batch{done: make(chan struct{})}
	c.mu.Unlock()
	first, err := c.log.Append(b.recs...)
	if err == nil {
		err = c.log.Sync()
	}
	b.first, b.err = first, err
	close(b.done)
	if err != nil && err != ErrFull {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		return err
	}
	return nil
}
