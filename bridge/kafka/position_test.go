package kafka_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

const offsets = "edge.offsets"

// positionWriter writes records to the offsets topic as a gateway's
// transactional producer would, or outside a transaction.
type positionWriter struct {
	t *testing.T
	p sarama.SyncProducer
}

func newPositionWriter(t *testing.T, brokers []string, txnID string) *positionWriter {
	t.Helper()
	cfg := kafka.SaramaConfig(kafka.Options{ClientID: "position-test", TransactionalID: txnID})
	if txnID == "" {
		cfg.Producer.Idempotent, cfg.Net.MaxOpenRequests = false, 5
	}
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &positionWriter{t: t, p: p}
}

func positionMsg(key, queue string, next uint64) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{Topic: offsets, Key: sarama.StringEncoder(key),
		Value: sarama.StringEncoder(fmt.Sprintf(`{"gateway":%q,"queue":%q,"position":%d}`, key, queue, next))}
}

// txn writes msgs in one transaction and commits it, or aborts it.
func (w *positionWriter) txn(commit bool, msgs ...*sarama.ProducerMessage) {
	w.t.Helper()
	if err := w.p.BeginTxn(); err != nil {
		w.t.Fatal(err)
	}
	if err := w.p.SendMessages(msgs); err != nil {
		w.t.Fatal(err)
	}
	end := w.p.CommitTxn
	if !commit {
		end = w.p.AbortTxn
	}
	if err := end(); err != nil {
		w.t.Fatal(err)
	}
}

func (w *positionWriter) send(msgs ...*sarama.ProducerMessage) {
	w.t.Helper()
	if err := w.p.SendMessages(msgs); err != nil {
		w.t.Fatal(err)
	}
}

// others writes n records of other keys, outside transactions, with
// incompressible values of about 900 bytes: n = 1200 is more than one
// fetch (1 MiB) takes.
func others(t *testing.T, w *positionWriter, round, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(round), 7))
	raw := make([]byte, 675)
	var msgs []*sarama.ProducerMessage
	for j := range n {
		for i := range raw {
			raw[i] = byte(r.Uint32())
		}
		msgs = append(msgs, &sarama.ProducerMessage{Topic: offsets, Key: sarama.StringEncoder(fmt.Sprintf("gw-x%d", j)),
			Value: sarama.StringEncoder(base64.StdEncoding.EncodeToString(raw))})
	}
	w.send(msgs...)
}

// delivered connects gw-1's producer, takes over and reads its position.
func delivered(t *testing.T, brokers []string, o kafka.Options) (bridge.Position, bool, error) {
	t.Helper()
	o.Brokers, o.ClientID = brokers, "test"
	o.TransactionalID, o.OffsetsTopic, o.PositionKey = "edgegate-gw-1", offsets, "gw-1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := kafka.NewConnector(o)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	pos, found, err := p.Committed(ctx)
	if found && time.Since(pos.At).Abs() > time.Minute {
		t.Errorf("position written at %v, not now", pos.At)
	}
	return bridge.Position{Queue: pos.Queue, Next: pos.Next}, found, err // where and when aside
}

// TestDeliveredPosition: the newest committed record under the gateway's
// key counts, whatever lies around it on the shared partition: records of
// aborted transactions and of other keys, an open transaction of another
// producer that started before the last commit, a tombstone, records
// outside transactions, and more than one fetch's worth of records.
func TestDeliveredPosition(t *testing.T) {
	for name, tc := range map[string]struct {
		write func(t *testing.T, brokers []string)
		want  bridge.Position
		found bool
	}{
		"nothing": {write: func(*testing.T, []string) {}},
		"only other gateways": {write: func(t *testing.T, b []string) {
			newPositionWriter(t, b, "edgegate-gw-2").txn(true, positionMsg("gw-2", "q2", 9))
		}},
		"newest commit": {write: func(t *testing.T, b []string) {
			w := newPositionWriter(t, b, "edgegate-gw-1")
			for i := uint64(1); i <= 5; i++ {
				w.txn(true, positionMsg("gw-1", "q1", i*10))
			}
		}, want: bridge.Position{Queue: "q1", Next: 50}, found: true},
		"aborted after a commit": {write: func(t *testing.T, b []string) {
			w := newPositionWriter(t, b, "edgegate-gw-1")
			w.txn(true, positionMsg("gw-1", "q1", 10))
			w.txn(false, positionMsg("gw-1", "q1", 20))
		}, want: bridge.Position{Queue: "q1", Next: 10}, found: true},
		"commit after another producer's open transaction": {write: func(t *testing.T, b []string) {
			w := newPositionWriter(t, b, "edgegate-gw-1")
			w.txn(true, positionMsg("gw-1", "q1", 10))
			kafkatest.OpenTxn(t, b, offsets, "gw-2", `{"gateway":"gw-2","queue":"q2","position":3}`)
			w.txn(true, positionMsg("gw-1", "q1", 20))
			w.txn(true, positionMsg("gw-1", "q1", 30))
		}, want: bridge.Position{Queue: "q1", Next: 30}, found: true},
		"tombstone": {write: func(t *testing.T, b []string) {
			w := newPositionWriter(t, b, "edgegate-gw-1")
			w.txn(true, positionMsg("gw-1", "q1", 10))
			w.txn(true, &sarama.ProducerMessage{Topic: offsets, Key: sarama.StringEncoder("gw-1")})
		}},
		"outside a transaction, after one": {write: func(t *testing.T, b []string) {
			newPositionWriter(t, b, "edgegate-gw-1").txn(true, positionMsg("gw-1", "q1", 10))
			newPositionWriter(t, b, "").send(positionMsg("gw-1", "q1", 12))
		}, want: bridge.Position{Queue: "q1", Next: 12}, found: true},
		"beyond one fetch": {write: func(t *testing.T, b []string) {
			w := newPositionWriter(t, b, "edgegate-gw-1")
			other := newPositionWriter(t, b, "")
			for i := uint64(1); i <= 10; i++ {
				others(t, other, int(i), 300) // 3 MB in all
				w.txn(true, positionMsg("gw-1", "q1", i))
			}
		}, want: bridge.Position{Queue: "q1", Next: 10}, found: true},
	} {
		t.Run(name, func(t *testing.T) {
			_, brokers := kafkatest.Start(t, 1, offsets)
			tc.write(t, brokers)
			pos, found, err := delivered(t, brokers, kafka.Options{})
			if err != nil || found != tc.found || pos != tc.want {
				t.Errorf("position = %+v, %v, %v; want %+v, %v, nil", pos, found, err, tc.want, tc.found)
			}
		})
	}
}

// TestDeliveredUnreadable: a record under the gateway's key that is not a
// position is an error that says how to clear it, not "no position" (the
// gateway would send its queue again) nor the record before it.
func TestDeliveredUnreadable(t *testing.T) {
	_, brokers := kafkatest.Start(t, 1, offsets)
	w := newPositionWriter(t, brokers, "edgegate-gw-1")
	w.txn(true, positionMsg("gw-1", "q1", 10))
	w.txn(true, &sarama.ProducerMessage{Topic: offsets, Key: sarama.StringEncoder("gw-1"), Value: sarama.StringEncoder("not json")})
	_, found, err := delivered(t, brokers, kafka.Options{})
	if err == nil || found || !strings.Contains(err.Error(), `write a tombstone (null value) under key "gw-1"`) {
		t.Errorf("position: found %v, err %v; want an error naming the fix", found, err)
	}
	// A valid record after it counts again (written by a producer made
	// after the one Delivered fenced).
	newPositionWriter(t, brokers, "edgegate-gw-1").txn(true, positionMsg("gw-1", "q1", 11))
	if pos, found, err := delivered(t, brokers, kafka.Options{}); err != nil || !found || pos.Next != 11 {
		t.Errorf("after a valid record: %+v %v %v", pos, found, err)
	}
}

// TestDeliveredSlowFetches: every fetch of the offsets topic takes 400 ms
// (a slow uplink) and the position lies several fetches in. The read
// waits for each answer instead of taking a quiet moment for the end.
func TestDeliveredSlowFetches(t *testing.T) {
	c, brokers := kafkatest.Start(t, 1, offsets)
	w := newPositionWriter(t, brokers, "edgegate-gw-1")
	other := newPositionWriter(t, brokers, "")
	for i := uint64(1); i <= 3; i++ {
		others(t, other, int(i), 1200) // over 1 MiB: a fetch each
		w.txn(true, positionMsg("gw-1", "q1", i))
	}
	var fetches atomic.Int32
	c.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		fetches.Add(1)
		c.SleepControl(func() { time.Sleep(400 * time.Millisecond) })
		return nil, nil, false
	})
	pos, found, err := delivered(t, brokers, kafka.Options{})
	if err != nil || !found || pos != (bridge.Position{Queue: "q1", Next: 3}) {
		t.Errorf("position = %+v, %v, %v; want {q1 3}", pos, found, err)
	}
	if n := fetches.Load(); n < 3 {
		t.Errorf("%d fetches; the test wants the position several fetches in", n)
	}
}

// TestDeliveredFailures: a fetch the broker refuses, one that never comes
// back within the stall timeout, and a broker over its quota that keeps
// answering empty, are errors, never "no position".
func TestDeliveredFailures(t *testing.T) {
	var throttled atomic.Int32
	for name, fault := range map[string]func(c *kfake.Cluster, release <-chan struct{}){
		"always throttled": func(c *kfake.Cluster, _ <-chan struct{}) {
			c.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				throttled.Add(1)
				fr := req.(*kmsg.FetchRequest)
				resp := fr.ResponseKind().(*kmsg.FetchResponse)
				resp.ThrottleMillis = 5
				for _, rt := range fr.Topics {
					st := kmsg.NewFetchResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewFetchResponseTopicPartition()
						sp.Partition, sp.HighWatermark, sp.LastStableOffset = rp.Partition, 10, 10
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
		},
		"broker error": func(c *kfake.Cluster, _ <-chan struct{}) {
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: offsets, Count: -1})
		},
		"no answer": func(c *kfake.Cluster, release <-chan struct{}) {
			c.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.SleepControl(func() { <-release })
				return nil, nil, false
			})
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, brokers := kafkatest.Start(t, 1, offsets)
			newPositionWriter(t, brokers, "edgegate-gw-1").txn(true, positionMsg("gw-1", "q1", 10))
			release := make(chan struct{})
			defer close(release)
			fault(c, release)
			began := time.Now()
			// A stall timeout a loaded machine's answers stay well within
			// (the one held back never comes).
			_, found, err := delivered(t, brokers, kafka.Options{StallTimeout: 3 * time.Second})
			if err == nil || found {
				t.Errorf("position: found %v, err %v; want an error", found, err)
			}
			if took := time.Since(began); took > 15*time.Second {
				t.Errorf("the failed read took %v", took)
			}
			if n := throttled.Load(); name == "always throttled" && n != 21 {
				t.Errorf("%d throttled fetches before the error, want 21", n)
			}
			t.Log(err)
		})
	}
}
