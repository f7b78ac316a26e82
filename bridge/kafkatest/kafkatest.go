// Package kafkatest starts real Kafka-protocol brokers (kfake) for tests and
// reads topics back through sarama, as a central consumer would.
package kafkatest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Start runs an in-process kfake cluster with the topics (one partition
// each unless partitions says otherwise) and returns its bootstrap
// addresses. It is closed when the test ends.
func Start(t testing.TB, partitions int32, topics ...string) (*kfake.Cluster, []string) {
	t.Helper()
	return StartOnPort(t, 0, partitions, topics...)
}

// StartOnPort is Start on a given port (0 for any).
func StartOnPort(t testing.TB, port int, partitions int32, topics ...string) (*kfake.Cluster, []string) {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...)}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr formats a loopback address.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Consume reads every partition of topic from the beginning with
// read_committed isolation until want messages have arrived or timeout
// passes, and returns them in partition, offset order. It fails the test on
// timeout.
func Consume(t testing.TB, brokers []string, topic string, want int, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	msgs, err := ConsumeN(brokers, topic, want, timeout)
	if err != nil {
		t.Fatalf("consume %s: %v (got %d of %d)", topic, err, len(msgs), want)
	}
	return msgs
}

// ConsumeN is Consume without a testing.TB: it returns what it read and an
// error when fewer than want arrived in time. It reads a little past want
// (200 ms without news) so that extra records show up as a surplus.
func ConsumeN(brokers []string, topic string, want int, timeout time.Duration) ([]*sarama.ConsumerMessage, error) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	return ConsumeWith(cfg, brokers, topic, want, timeout)
}

// ConsumeWith is ConsumeN with a base configuration (for TLS or SASL);
// it sets read_committed isolation.
func ConsumeWith(cfg *sarama.Config, brokers []string, topic string, want int, timeout time.Duration) ([]*sarama.ConsumerMessage, error) {
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Fetch.Max = 1 << 20
	c, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *sarama.ConsumerMessage, 1024)
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		pcs = append(pcs, pc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, pc := range pcs {
		go func(pc sarama.PartitionConsumer) {
			for {
				select {
				case m, ok := <-pc.Messages():
					if !ok {
						return
					}
					select {
					case out <- m:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}(pc)
	}
	defer func() {
		cancel()
		for _, pc := range pcs {
			pc.Close()
		}
	}()
	var msgs []*sarama.ConsumerMessage
	deadline := time.After(timeout)
	for {
		quiet := time.After(200 * time.Millisecond)
		if len(msgs) < want {
			quiet = nil
		}
		select {
		case m := <-out:
			msgs = append(msgs, m)
		case <-quiet:
			return msgs, nil
		case <-deadline:
			if len(msgs) >= want {
				return msgs, nil
			}
			return msgs, context.DeadlineExceeded
		}
	}
}
