// Package kafkatest starts real Kafka-protocol brokers (kfake) for tests and
// reads topics back through sarama, as a central consumer would (with
// bridge/kafka's Read).
package kafkatest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/edgegate/edgegate/bridge/kafka"
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
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	CreateTopics(t, c, partitions, topics...)
	return c, c.ListenAddrs()
}

// CreateTopics creates the topics, each with the given number of
// partitions. A topic whose name ends in ".offsets" holds delivered
// positions and is created as a deployment creates it: compacted
// (kafka.OffsetsTopicConfig); the gateway refuses one that is not.
func CreateTopics(t testing.TB, c *kfake.Cluster, partitions int32, topics ...string) {
	t.Helper()
	for _, topic := range topics {
		var cfg map[string]string
		if strings.HasSuffix(topic, ".offsets") {
			cfg = kafka.OffsetsTopicConfig
		}
		if err := c.CreateTopic(topic, partitions, cfg); err != nil {
			t.Fatalf("create topic %s: %v", topic, err)
		}
	}
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
// passes, and returns them in the order they arrived (offset order within
// a partition). It fails the test on timeout.
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
	return ConsumeWith(kafka.ReadConfig(""), brokers, topic, want, timeout)
}

// ConsumeWith is ConsumeN with a base configuration (for TLS or SASL);
// it sets read_committed isolation. Fetch errors are left to sarama, which
// retries them: a test reads what arrives in time.
func ConsumeWith(cfg *sarama.Config, brokers []string, topic string, want int, timeout time.Duration) ([]*sarama.ConsumerMessage, error) {
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	cfg.Consumer.Return.Errors = false
	cfg.Consumer.Fetch.Max = 1 << 20
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Once want have arrived, stop after 200 ms without news.
	const settle = 200 * time.Millisecond
	var quiet *time.Timer
	if want <= 0 {
		quiet = time.AfterFunc(settle, cancel)
	}
	var msgs []*sarama.ConsumerMessage
	err = kafka.Read(ctx, client, kafka.ReadOptions{Topic: topic}, func(m *sarama.ConsumerMessage) error {
		msgs = append(msgs, m)
		switch {
		case len(msgs) < want:
		case quiet == nil:
			quiet = time.AfterFunc(settle, cancel)
		default:
			quiet.Reset(settle)
		}
		return nil
	})
	if quiet != nil {
		quiet.Stop()
	}
	if err != nil {
		return msgs, err
	}
	if len(msgs) < want {
		return msgs, context.DeadlineExceeded
	}
	return msgs, nil
}

// OpenTxn begins a transaction of another transactional producer that
// writes one record (key, value) to topic and leaves it open until the
// test ends, as a producer that lost power mid-transaction would until
// Kafka's transaction timeout aborts it. The topic's partitions then have
// a last stable offset below their end.
func OpenTxn(t testing.TB, brokers []string, topic, key, value string) {
	t.Helper()
	cfg := kafka.SaramaConfig(kafka.Options{ClientID: "open-txn", TransactionalID: "open-txn-" + key})
	p, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		t.Fatalf("open transaction: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.BeginTxn(); err != nil {
		t.Fatalf("open transaction: %v", err)
	}
	p.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(value)}
	select {
	case <-p.Successes():
	case perr := <-p.Errors():
		t.Fatalf("open transaction: %v", perr.Err)
	case <-time.After(20 * time.Second):
		t.Fatal("open transaction: no answer from kafka")
	}
}
