package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	metrics "github.com/rcrowley/go-metrics"
)

func init() {
	// sarama records its metrics in go-metrics, whose meters tick in a
	// goroutine that never stops and cost CPU on a small gateway. The
	// gateway reports its own metrics, so turn them off.
	metrics.UseNilMetrics = true
}

// KafkaOptions configures the sarama producer.
type KafkaOptions struct {
	Brokers  []string
	ClientID string
}

// SaramaConfig returns the producer configuration: idempotent (so retries
// never duplicate or reorder within a partition), acks from all in-sync
// replicas, zstd compression, and enough retries with capped exponential
// backoff to ride out a broker restart without failing the batch.
func SaramaConfig(o KafkaOptions) *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = o.ClientID
	c.Version = sarama.V2_8_0_0 // idempotence needs 0.11, zstd 2.1
	c.Net.MaxOpenRequests = 1   // required by idempotence
	c.Net.DialTimeout = 5 * time.Second
	c.Net.ReadTimeout = 10 * time.Second
	c.Net.WriteTimeout = 10 * time.Second
	c.Metadata.Retry.Max = 3
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Compression = sarama.CompressionZSTD
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Retry.Max = 20
	c.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return min(100*time.Millisecond<<min(retries, 5), 2*time.Second)
	}
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	c.Producer.Flush.MaxMessages = 0
	c.Producer.MaxMessageBytes = 1 << 20
	c.Producer.Partitioner = sarama.NewHashPartitioner // key = gateway/device: one partition per device
	return c
}

// NewKafkaConnector returns a Connector that makes sarama async producers.
func NewKafkaConnector(o KafkaOptions) Connector {
	return func(ctx context.Context) (Producer, error) {
		type result struct {
			p   sarama.AsyncProducer
			err error
		}
		ch := make(chan result, 1)
		go func() {
			p, err := sarama.NewAsyncProducer(o.Brokers, SaramaConfig(o))
			ch <- result{p, err}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, explainKafkaError(r.err)
			}
			return &saramaProducer{p: r.p}, nil
		case <-ctx.Done():
			go func() { // do not leak a producer made after we gave up
				if r := <-ch; r.err == nil {
					r.p.Close()
				}
			}()
			return nil, ctx.Err()
		}
	}
}

func explainKafkaError(err error) error {
	if errors.Is(err, sarama.ErrOutOfBrokers) {
		return fmt.Errorf("no Kafka broker reachable (%w)", err)
	}
	return err
}

type saramaProducer struct {
	p sarama.AsyncProducer
}

var _ Producer = (*saramaProducer)(nil)

// Send pushes the batch and waits for every record's acknowledgement. It
// feeds the input and drains results in one loop, so a batch larger than
// sarama's channel buffers cannot deadlock.
func (s *saramaProducer) Send(ctx context.Context, batch []Record) error {
	msgs := make([]sarama.ProducerMessage, len(batch))
	for i, r := range batch {
		m := &msgs[i]
		m.Topic = r.Topic
		m.Key = sarama.ByteEncoder(r.Key)
		m.Value = sarama.ByteEncoder(r.Value)
		if len(r.Headers) > 0 {
			m.Headers = make([]sarama.RecordHeader, len(r.Headers))
			for j, h := range r.Headers {
				m.Headers[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: []byte(h.Value)}
			}
		}
	}
	sent, done := 0, 0
	var firstErr error
	for done < len(batch) {
		var in chan<- *sarama.ProducerMessage
		var next *sarama.ProducerMessage
		if sent < len(batch) {
			in, next = s.p.Input(), &msgs[sent]
		}
		select {
		case in <- next:
			sent++
		case <-s.p.Successes():
			done++
		case perr := <-s.p.Errors():
			done++
			if firstErr == nil {
				firstErr = fmt.Errorf("produce to %s: %w", perr.Msg.Topic, perr.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return firstErr
}

// Close stops the producer, waiting at most two seconds for it to flush.
func (s *saramaProducer) Close() error {
	done := make(chan error, 1)
	go func() { done <- s.p.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Second):
		return errors.New("close kafka producer: timed out; in-flight records will be sent again")
	}
}
