package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// ReadConfig returns the base sarama configuration of a client for Read:
// read_committed isolation (a consumer then sees only records of committed
// transactions, which is how the gateway's exactly-once delivery reaches
// it), partition errors returned to Read, and the protocol version the
// producer speaks. An empty clientID keeps sarama's default.
func ReadConfig(clientID string) *sarama.Config {
	c := sarama.NewConfig()
	if clientID != "" {
		c.ClientID = clientID
	}
	c.Version = sarama.V2_8_0_0
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Return.Errors = true
	return c
}

// ReadOptions say what Read reads.
type ReadOptions struct {
	Topic string
	// Partitions limits reading to these partitions; nil reads every
	// partition of Topic.
	Partitions []int32
	// Start is each partition's first offset: an offset,
	// sarama.OffsetOldest or sarama.OffsetNewest. A partition missing from
	// it starts at the oldest record.
	Start map[int32]int64
	// ToEnd ends each partition at the end offset it had when Read began,
	// or after Idle without records there (records of a transaction still
	// open then are not waited for). Partitions with nothing to read are
	// not read at all.
	ToEnd bool
	// Idle is ToEnd's wait for a quiet partition; default 2s.
	Idle time.Duration
}

// readItem is what a partition's goroutine hands to Read's loop.
type readItem struct {
	m    *sarama.ConsumerMessage
	err  error
	done bool // the partition has ended
}

// Read consumes the partitions of o.Topic through client, one goroutine
// per partition, and calls fn for each message in the order messages
// arrive (offset order within a partition), on the goroutine that called
// Read. Isolation and the rest of the consumer's settings are client's
// (see ReadConfig, which reads read_committed).
//
// Read returns nil when ctx ends or when every partition read has ended
// (with ToEnd, at its end; otherwise only if sarama closes it); fn's error
// as it is, which is how a caller stops on its own condition; and, when
// the client's configuration returns consumer errors, the first error of
// any partition. It returns only after its goroutines have stopped, and
// does not close client.
func Read(ctx context.Context, client sarama.Client, o ReadOptions, fn func(*sarama.ConsumerMessage) error) error {
	parts := o.Partitions
	if parts == nil {
		var err error
		if parts, err = client.Partitions(o.Topic); err != nil {
			return fmt.Errorf("topic %s: %w", o.Topic, err)
		}
	}
	start := func(p int32) int64 {
		if s, ok := o.Start[p]; ok {
			return s
		}
		return sarama.OffsetOldest
	}
	idle := o.Idle
	if idle <= 0 {
		idle = 2 * time.Second
	}
	ends := map[int32]int64{}
	if o.ToEnd {
		for _, p := range parts {
			end, err := client.GetOffset(o.Topic, p, sarama.OffsetNewest)
			if err != nil {
				return fmt.Errorf("end offset of %s/%d: %w", o.Topic, p, err)
			}
			ends[p] = end
		}
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer consumer.Close()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan readItem, 256)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	active := 0
	for _, p := range parts {
		if o.ToEnd {
			first, err := client.GetOffset(o.Topic, p, sarama.OffsetOldest)
			if err != nil {
				return fmt.Errorf("first offset of %s/%d: %w", o.Topic, p, err)
			}
			if s := start(p); ends[p] <= first || (s >= 0 && s >= ends[p]) || s == sarama.OffsetNewest {
				continue // nothing to read
			}
		}
		pc, err := consumer.ConsumePartition(o.Topic, p, start(p))
		if err != nil {
			return fmt.Errorf("consume %s/%d: %w", o.Topic, p, err)
		}
		active++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.Close()
			readPartition(rctx, pc, o.ToEnd, ends[p], idle, ch)
		}()
	}
	for active > 0 {
		select {
		case <-ctx.Done():
			return nil
		case it := <-ch:
			switch {
			case it.err != nil:
				return fmt.Errorf("read %s: %w", o.Topic, it.err)
			case it.done:
				active--
			default:
				if err := fn(it.m); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// readPartition hands pc's messages and errors to out until ctx ends, the
// partition is closed or (toEnd) it reaches end or stays quiet for idle.
func readPartition(ctx context.Context, pc sarama.PartitionConsumer, toEnd bool, end int64, idle time.Duration, out chan<- readItem) {
	send := func(it readItem) bool {
		select {
		case out <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	var quiet <-chan time.Time
	var t *time.Timer
	if toEnd {
		t = time.NewTimer(idle)
		defer t.Stop()
		quiet = t.C
	}
	errs := pc.Errors()
	for {
		select {
		case m, ok := <-pc.Messages():
			if !ok {
				send(readItem{done: true})
				return
			}
			if !send(readItem{m: m}) {
				return
			}
			if toEnd {
				if m.Offset >= end-1 {
					send(readItem{done: true})
					return
				}
				t.Reset(idle)
			}
		case e, ok := <-errs:
			if !ok {
				errs = nil // closed with the messages, which may hold more
				continue
			}
			send(readItem{err: e})
			return
		case <-quiet:
			send(readItem{done: true})
			return
		case <-ctx.Done():
			return
		}
	}
}
