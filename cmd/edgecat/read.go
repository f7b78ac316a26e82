package main

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafka"
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

// consume reads the partitions from their start offsets with
// bridge/kafka's reader, decoding each message.
func consume(ctx context.Context, k *kafkaFlags, client sarama.Client, parts []int32, starts map[int32]int64, o readOptions, fn func(record) error) error {
	return kafka.Read(ctx, client, kafka.ReadOptions{Topic: k.topic, Partitions: parts, Start: starts, ToEnd: o.toEnd, Idle: o.idle},
		func(m *sarama.ConsumerMessage) error { return fn(decode(m)) })
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
