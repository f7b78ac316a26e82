package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/summary"
)

// record is one summary read, with where it was read.
type record struct {
	summary.Summary
	Partition int32
	Offset    int64
	Time      time.Time // the record's timestamp
	Err       error     // the record is not a valid summary
	Raw       []byte
}

// readOptions say what to read.
type readOptions struct {
	from string // beginning, latest or a time
	// toEnd stops once every partition has reached the end offset it had
	// when reading began (records of transactions still open then are not
	// waited for beyond idle).
	toEnd bool
	idle  time.Duration // with toEnd: stop a partition after this long without records
}

// read consumes every partition of the topic and calls fn for each record
// in the order it arrives (per partition, in offset order). It returns
// when ctx ends, when fn returns an error, or (toEnd) at the end.
func read(ctx context.Context, k *kafkaFlags, o readOptions, fn func(record) error) error {
	client, err := sarama.NewClient(k.brokerList(), k.config())
	if err != nil {
		return fmt.Errorf("connect to kafka %s: %w", k.brokers, err)
	}
	defer client.Close()
	parts, err := client.Partitions(k.topic)
	if err != nil {
		return fmt.Errorf("topic %s: %w", k.topic, err)
	}
	starts, err := startOffsets(client, k.topic, parts, o.from)
	if err != nil {
		return err
	}
	return consume(ctx, k, client, parts, starts, o, fn)
}

// readFrom reads each partition from the given offset to its end.
func readFrom(ctx context.Context, k *kafkaFlags, client sarama.Client, starts map[int32]int64, fn func(record) error) error {
	parts := make([]int32, 0, len(starts))
	for p := range starts {
		parts = append(parts, p)
	}
	return consume(ctx, k, client, parts, starts, readOptions{toEnd: true, idle: 2 * time.Second}, fn)
}

func consume(ctx context.Context, k *kafkaFlags, client sarama.Client, parts []int32, starts map[int32]int64, o readOptions, fn func(record) error) error {
	var err error
	if o.toEnd && o.idle <= 0 {
		o.idle = 2 * time.Second
	}
	ends := map[int32]int64{}
	if o.toEnd {
		for _, p := range parts {
			if ends[p], err = client.GetOffset(k.topic, p, sarama.OffsetNewest); err != nil {
				return fmt.Errorf("end offset of %s/%d: %w", k.topic, p, err)
			}
		}
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return err
	}
	defer consumer.Close()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type item struct {
		m    *sarama.ConsumerMessage
		err  error
		done int32 // partition finished (toEnd)
	}
	ch := make(chan item, 256)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	active := 0
	for _, p := range parts {
		if o.toEnd {
			first, err := client.GetOffset(k.topic, p, sarama.OffsetOldest)
			if err != nil {
				return fmt.Errorf("first offset of %s/%d: %w", k.topic, p, err)
			}
			if ends[p] <= first || (starts[p] >= 0 && starts[p] >= ends[p]) || starts[p] == sarama.OffsetNewest {
				continue // nothing to read
			}
		}
		pc, err := consumer.ConsumePartition(k.topic, p, starts[p])
		if err != nil {
			return fmt.Errorf("consume %s/%d: %w", k.topic, p, err)
		}
		active++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.Close()
			send := func(it item) bool {
				select {
				case ch <- it:
					return true
				case <-rctx.Done():
					return false
				}
			}
			// With toEnd, a partition is done at its end offset, or after
			// idle without records (a transaction still open there).
			var quiet <-chan time.Time
			var t *time.Timer
			if o.toEnd {
				t = time.NewTimer(o.idle)
				defer t.Stop()
				quiet = t.C
			}
			for {
				select {
				case m := <-pc.Messages():
					if !send(item{m: m}) {
						return
					}
					if o.toEnd {
						if m.Offset >= ends[p]-1 {
							send(item{done: p + 1})
							return
						}
						t.Reset(o.idle)
					}
				case e := <-pc.Errors():
					send(item{err: e})
					return
				case <-quiet:
					send(item{done: p + 1})
					return
				case <-rctx.Done():
					return
				}
			}
		}()
	}
	if o.toEnd && active == 0 {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case it := <-ch:
			switch {
			case it.err != nil:
				return fmt.Errorf("read %s: %w", k.topic, it.err)
			case it.done != 0:
				if active--; active == 0 {
					return nil
				}
				continue
			}
			if err := fn(decode(it.m)); err != nil {
				return err
			}
		}
	}
}

// decode turns a message into a record; a bad one carries its error.
func decode(m *sarama.ConsumerMessage) record {
	hs := make([]summary.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = summary.Header{Key: h.Key, Value: h.Value}
	}
	r := record{Partition: m.Partition, Offset: m.Offset, Time: m.Timestamp, Raw: m.Value}
	r.Summary, r.Err = summary.Decode(m.Value, hs)
	if r.Err == nil {
		r.Err = summary.Validate(r.Summary)
	}
	return r
}
