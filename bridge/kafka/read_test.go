package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// produceTxns writes, through a transactional producer, one committed
// transaction per entry of committed (values "p<partition>-<i>", i from
// 0) and then an aborted one with a record in every partition.
func produceTxns(t *testing.T, brokers []string, topic string, committed map[int32]int) {
	t.Helper()
	cfg := kafka.SaramaConfig(kafka.Options{ClientID: "read-test", TransactionalID: "read-test"})
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	txn := func(commit bool, msgs []*sarama.ProducerMessage) {
		if err := p.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		if err := p.SendMessages(msgs); err != nil {
			t.Fatal(err)
		}
		end := p.CommitTxn
		if !commit {
			end = p.AbortTxn
		}
		if err := end(); err != nil {
			t.Fatal(err)
		}
	}
	var aborted []*sarama.ProducerMessage
	for part, n := range committed {
		var msgs []*sarama.ProducerMessage
		for i := range n {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: part, Value: sarama.StringEncoder(fmt.Sprintf("p%d-%d", part, i))})
		}
		txn(true, msgs)
		aborted = append(aborted, &sarama.ProducerMessage{Topic: topic, Partition: part, Value: sarama.StringEncoder("aborted")})
	}
	txn(false, aborted)
}

func readClient(t *testing.T, brokers []string) sarama.Client {
	t.Helper()
	c, err := sarama.NewClient(brokers, kafka.ReadConfig("read-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRead: every partition read_committed, in offset order per
// partition, from each start; ToEnd ends at the end (here after Idle: the
// aborted transaction's record and the transaction markers come after the
// last committed record); fn's error ends it and is returned; ctx's end
// ends it without an error.
func TestRead(t *testing.T) {
	const topic = "t"
	_, brokers := kafkatest.Start(t, 3, topic)
	produceTxns(t, brokers, topic, map[int32]int{0: 3, 1: 2, 2: 0})
	client := readClient(t, brokers)
	read := func(ctx context.Context, o kafka.ReadOptions, fn func(*sarama.ConsumerMessage) error) (map[int32][]string, error) {
		got := map[int32][]string{}
		err := kafka.Read(ctx, client, o, func(m *sarama.ConsumerMessage) error {
			got[m.Partition] = append(got[m.Partition], string(m.Value))
			if fn != nil {
				return fn(m)
			}
			return nil
		})
		return got, err
	}
	want := map[int32][]string{0: {"p0-0", "p0-1", "p0-2"}, 1: {"p1-0", "p1-1"}}
	for name, tc := range map[string]struct {
		o    kafka.ReadOptions
		want map[int32][]string
	}{
		"from the beginning": {kafka.ReadOptions{Topic: topic, ToEnd: true}, want},
		"one partition":      {kafka.ReadOptions{Topic: topic, ToEnd: true, Partitions: []int32{1}}, map[int32][]string{1: want[1]}},
		"from an offset":     {kafka.ReadOptions{Topic: topic, ToEnd: true, Start: map[int32]int64{0: 1}}, map[int32][]string{0: want[0][1:], 1: want[1]}},
		"from the end":       {kafka.ReadOptions{Topic: topic, ToEnd: true, Start: map[int32]int64{0: sarama.OffsetNewest, 1: sarama.OffsetNewest}}, map[int32][]string{}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Idle also bounds the wait for a partition's first fetch: time
			// for a loaded machine to answer it.
			tc.o.Idle = 3 * time.Second
			got, err := read(ctx, tc.o, nil)
			if err != nil || ctx.Err() != nil {
				t.Fatalf("Read: %v (ctx %v)", err, ctx.Err())
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for p, w := range tc.want {
				if !slices.Equal(got[p], w) {
					t.Errorf("partition %d: %v, want %v", p, got[p], w)
				}
			}
		})
	}
	t.Run("stop from fn", func(t *testing.T) {
		stop := errors.New("enough")
		n := 0
		_, err := read(context.Background(), kafka.ReadOptions{Topic: topic}, func(*sarama.ConsumerMessage) error {
			if n++; n == 2 {
				return stop
			}
			return nil
		})
		if err != stop || n != 2 {
			t.Errorf("err %v after %d messages, want %v after 2", err, n, stop)
		}
	})
	t.Run("stop on ctx", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n := 0
		got, err := read(ctx, kafka.ReadOptions{Topic: topic}, func(*sarama.ConsumerMessage) error {
			if n++; n == 5 {
				cancel() // everything committed is read; without ToEnd, Read waits for more
			}
			return nil
		})
		if err != nil || !slices.Equal(got[0], want[0]) || !slices.Equal(got[1], want[1]) {
			t.Errorf("got %v, %v", got, err)
		}
	})
}
