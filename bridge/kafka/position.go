package kafka

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge"
)

// positionRecord is the value of a position record on the offsets topic,
// keyed by the gateway id. Records of older versions may lack fields; a
// reader ignores fields it does not know.
//
// Queue is the outbound queue's identity and Position how far it is
// delivered; Host is the host name of the gateway that wrote it (since
// the queue identity check: it helps find the other gateway when two
// share an id).
type positionRecord struct {
	Gateway  string `json:"gateway"`
	Queue    string `json:"queue"`
	Position uint64 `json:"position"`
	Host     string `json:"host,omitempty"`
}

func encodePosition(gateway, host string, p bridge.Position) []byte {
	b, _ := json.Marshal(positionRecord{Gateway: gateway, Queue: p.Queue, Position: p.Next, Host: host})
	return b
}

// positionReader finds the newest committed position record under one
// key in its partition of the offsets topic. It reads the partition with
// read_uncommitted isolation up to its high watermark and settles each
// transaction by its marker, as a read_committed consumer does, rather
// than stopping at the last stable offset: another gateway's open
// transaction on the shared partition (one that lost power mid-batch stays
// open until its transaction timeout) holds the last stable offset back,
// and this gateway's own commits after it would be missed. This gateway's
// own transactions are all settled by the time its producer is initialised
// (InitProducerId completes or aborts them), so what is still undecided at
// the end belongs to another producer: a second gateway with the same id,
// whose record does not count until it commits. Read before that (by
// Committed before TakeOver), this gateway's own last transaction may be
// undecided still: that read tells who wrote the position; the read after
// TakeOver settles it.
//
// A reader may be read again later: it goes on from where it stopped,
// with the undecided transactions it saw.
type positionReader struct {
	client sarama.Client
	topic  string
	part   int32
	key    []byte

	started bool
	next    int64                   // next offset to read
	latest  *foundPosition          // the committed record with the highest offset
	open    map[int64]foundPosition // producer id → its undecided transaction's newest record
}

type foundPosition struct {
	offset int64
	pos    bridge.Position
	found  bool  // false: a tombstone, which removes the position
	err    error // the record could not be decoded
}

// maxThrottled bounds the fetches in a row a broker over its quota may
// answer empty before the read fails (and the Forwarder connects again).
const maxThrottled = 20

// maxFetchBytes bounds one fetch response; a batch larger than the first
// try (1 MiB) is fetched again with room for it, up to this.
const maxFetchBytes = 64 << 20

func newPositionReader(client sarama.Client, topic, key string) (*positionReader, error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("offsets topic %s: %w", topic, err)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("offsets topic %s has no partitions", topic)
	}
	i, err := sarama.NewHashPartitioner(topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(len(parts)))
	if err != nil {
		return nil, fmt.Errorf("offsets topic %s: %w", topic, err)
	}
	return &positionReader{client: client, topic: topic, part: parts[i], key: []byte(key), open: map[int64]foundPosition{}}, nil
}

// read reads the partition up to its high watermark as it is now and
// returns the newest committed position under the key. A failed or
// timed-out request is an error (each request waits at most the client's
// Net.ReadTimeout); it never means "no position". When ctx ends, the
// request in flight is abandoned by closing the client.
func (r *positionReader) read(ctx context.Context) (bridge.Position, bool, error) {
	stop := context.AfterFunc(ctx, func() { r.client.Close() })
	defer stop()
	pos, found, err := r.readTo(ctx)
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = ctxErr
	}
	if err != nil {
		return bridge.Position{}, false, fmt.Errorf("read the delivered position from %s/%d: %w", r.topic, r.part, err)
	}
	return pos, found, nil
}

func (r *positionReader) readTo(ctx context.Context) (bridge.Position, bool, error) {
	end, err := r.client.GetOffset(r.topic, r.part, sarama.OffsetNewest)
	if err != nil {
		return bridge.Position{}, false, fmt.Errorf("end offset: %w", r.timedOut(err))
	}
	first, err := r.client.GetOffset(r.topic, r.part, sarama.OffsetOldest)
	if err != nil {
		return bridge.Position{}, false, fmt.Errorf("first offset: %w", r.timedOut(err))
	}
	if !r.started || r.next < first {
		r.next, r.started = first, true // what lay before first is deleted
	}
	maxBytes := int32(1 << 20)
	throttled := 0 // answers in a row held back by the broker's quota
	for r.next < end {
		if err := ctx.Err(); err != nil {
			return bridge.Position{}, false, err
		}
		block, throttle, err := r.fetch(maxBytes)
		if err != nil {
			return bridge.Position{}, false, err
		}
		before := r.next
		r.consume(block)
		if r.next > before {
			throttled = 0
			continue
		}
		switch {
		case block.Partial || partialAt(block, r.next):
			// The batch at r.next is larger than the response could
			// hold (brokers before 0.10.1 cut it): ask for more room.
			if maxBytes >= maxFetchBytes {
				return bridge.Position{}, false, fmt.Errorf("the record batch at offset %d is larger than %d bytes", r.next, maxFetchBytes)
			}
			maxBytes *= 2
		case throttle > 0: // a broker over its quota answers at once, empty
			if throttled++; throttled > maxThrottled {
				return bridge.Position{}, false, fmt.Errorf("the broker held back %d fetches in a row (over its quota; the last for %v)", throttled, throttle)
			}
			select {
			case <-time.After(throttle):
			case <-ctx.Done():
			}
		default:
			// Nothing but batches that compaction emptied lies
			// between here and the end: from a fetch offset below the
			// high watermark the broker returns every batch that has
			// a record.
			r.next = end
		}
	}
	if r.latest == nil || !r.latest.found {
		return bridge.Position{}, false, nil
	}
	if r.latest.err != nil {
		return bridge.Position{}, false, fmt.Errorf("the newest position record of %q, at offset %d, is unreadable (%w); "+
			"it is not one this gateway wrote: stop whatever writes it, then write a tombstone (null value) under key %q to drop it "+
			"(this gateway then delivers from its local position)", r.key, r.latest.offset, r.latest.err, r.key)
	}
	return r.latest.pos, true, nil
}

// partialAt reports whether the response's batch at next was cut short.
func partialAt(block *sarama.FetchResponseBlock, next int64) bool {
	for _, recs := range block.RecordsSet {
		if b := recs.RecordBatch; b != nil && b.PartialTrailingRecord && b.FirstOffset <= next {
			return true
		}
	}
	return false
}

// fetch asks the partition's leader for the records from r.next.
func (r *positionReader) fetch(maxBytes int32) (*sarama.FetchResponseBlock, time.Duration, error) {
	broker, err := r.client.Leader(r.topic, r.part)
	if err != nil {
		return nil, 0, fmt.Errorf("leader: %w", err)
	}
	req := &sarama.FetchRequest{Version: fetchVersion(r.client.Config().Version), MaxWaitTime: 500, MinBytes: 1, MaxBytes: maxBytes,
		Isolation: sarama.ReadUncommitted, SessionID: 0, SessionEpoch: -1}
	req.AddBlock(r.topic, r.part, r.next, maxBytes, -1)
	resp, err := broker.Fetch(req)
	if err != nil {
		_ = broker.Close() // sarama's own consumer does so: the next request dials again
		return nil, 0, fmt.Errorf("fetch from offset %d: %w", r.next, r.timedOut(err))
	}
	block := resp.GetBlock(r.topic, r.part)
	if block == nil {
		return nil, 0, fmt.Errorf("fetch from offset %d: %w", r.next, sarama.ErrIncompleteResponse)
	}
	if !errors.Is(block.Err, sarama.ErrNoError) {
		if errors.Is(block.Err, sarama.ErrNotLeaderForPartition) || errors.Is(block.Err, sarama.ErrUnknownTopicOrPartition) {
			_ = r.client.RefreshMetadata(r.topic) // for the next attempt
		}
		return nil, 0, fmt.Errorf("fetch from offset %d: %w", r.next, block.Err)
	}
	return block, resp.ThrottleTime, nil
}

// timedOut says so of a request that got no answer in time.
func (r *positionReader) timedOut(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("no answer within %v (kafka.stall_timeout): %w", r.client.Config().Net.ReadTimeout, err)
	}
	return err
}

// fetchVersion is the Fetch version sarama's consumer uses for v: 4 and
// later carry the isolation level and record batches (v2).
func fetchVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 12
	case v.IsAtLeast(sarama.V2_3_0_0):
		return 11
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 10
	default:
		return 4
	}
}

// consume takes the batches of a fetch response in offset order: the
// key's records, and the markers that settle transactions.
func (r *positionReader) consume(block *sarama.FetchResponseBlock) {
	for _, recs := range block.RecordsSet {
		b := recs.RecordBatch
		if b == nil {
			// A message set of the format before Kafka 0.11, which no
			// transactional producer (nor this gateway) writes: nothing
			// of ours, and not transactional.
			if ms := recs.MsgSet; ms != nil && len(ms.Messages) > 0 {
				r.next = max(r.next, ms.Messages[len(ms.Messages)-1].Offset+1)
			}
			continue
		}
		if b.PartialTrailingRecord || b.LastOffset() < r.next {
			continue // cut short by the response's size, or read already
		}
		if b.Control {
			r.settle(b)
		} else {
			for _, rec := range b.Records {
				off := b.FirstOffset + rec.OffsetDelta
				if off < r.next || !bytes.Equal(rec.Key, r.key) {
					continue
				}
				at := b.FirstTimestamp.Add(rec.TimestampDelta)
				if b.LogAppendTime {
					at = b.MaxTimestamp
				}
				p := decodePosition(off, at, rec.Value)
				if !b.IsTransactional {
					r.take(p)
				} else if o, ok := r.open[b.ProducerID]; !ok || o.offset < off {
					r.open[b.ProducerID] = p
				}
			}
		}
		r.next = b.LastOffset() + 1
	}
}

// settle applies a transaction marker: a commit makes the producer's
// record of the transaction count, an abort drops it.
func (r *positionReader) settle(b *sarama.RecordBatch) {
	p, ok := r.open[b.ProducerID]
	if !ok {
		return
	}
	if len(b.Records) == 0 || len(b.Records[0].Key) < 4 {
		return // not a marker this reader knows; the transaction stays undecided
	}
	// A control record's key: version (int16), type (int16): 0 abort, 1 commit.
	switch binary.BigEndian.Uint16(b.Records[0].Key[2:4]) {
	case 0:
		delete(r.open, b.ProducerID)
	case 1:
		delete(r.open, b.ProducerID)
		r.take(p)
	}
}

func (r *positionReader) take(p foundPosition) {
	if r.latest == nil || p.offset > r.latest.offset {
		r.latest = &p
	}
}

func decodePosition(offset int64, at time.Time, value []byte) foundPosition {
	if value == nil {
		return foundPosition{offset: offset} // a tombstone
	}
	var pr positionRecord
	if err := json.Unmarshal(value, &pr); err != nil {
		return foundPosition{offset: offset, found: true, err: err}
	}
	return foundPosition{offset: offset, found: true, pos: bridge.Position{Queue: pr.Queue, Next: pr.Position, Host: pr.Host, At: at}}
}
