package bridge_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// noise returns n incompressible bytes (zstd cannot bring them under a
// broker's limit).
func noise(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestPoisonRecordSetAside runs exactly-once delivery against a broker whose
// message.max.bytes is 100 KB. Between two runs of 30 summaries the queue
// holds two records Kafka can never take: one of 150 KB (under the
// forwarder's own bound, so the broker refuses it: MESSAGE_TOO_LARGE) and
// one of 600 KB (over kafka.max_record_bytes, never sent), then a small
// record on the same topic. Both poisons are set aside, with their reasons,
// and everything else is delivered exactly once, in order.
func TestPoisonRecordSetAside(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "100000"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kafkatest.CreateTopics(t, c, 1, summaries, dead, offsetsTopic)
	addrs := c.ListenAddrs()
	dir := t.TempDir()
	f := txnForwarder(t, dir, addrs, bridge.Options{})
	for m := 0; m < 30; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	refusedByKafka := noise(1, 150_000)
	tooLarge := noise(2, 600_000)
	f.Enqueue(bridge.Record{Topic: dead, Key: []byte("gw-1/big"), Value: refusedByKafka}, bridge.Mark{})
	f.Enqueue(bridge.Record{Topic: dead, Key: []byte("gw-1/huge"), Value: tooLarge}, bridge.Mark{})
	f.Enqueue(bridge.Record{Topic: dead, Key: []byte("gw-1/small"), Value: []byte("after the poison")}, bridge.Mark{})
	for m := 30; m < 60; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	stop := run(t, f)
	msgs, cerr := kafkatest.ConsumeN(addrs, summaries, 60, 20*time.Second)
	st := f.Stats()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if cerr != nil {
		t.Fatalf("after the poison records: %d of 60 summaries delivered in 20 s (%v); stats %+v", len(msgs), cerr, st)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 60)) {
		t.Errorf("read_committed consumer sees summaries %v, want 0..59 once each", got)
	}
	dl := kafkatest.Consume(t, addrs, dead, 1, 10*time.Second)
	if len(dl) != 1 || !bytes.Equal(dl[0].Value, []byte("after the poison")) {
		t.Errorf("dead-letter topic holds %d records (first %.40q), want only the small one", len(dl), dl[0].Value)
	}
	if st.Refused != 2 || st.RefusedDropped != 0 || st.Delivered != 61 || st.Queued != 0 {
		t.Errorf("stats: %d refused (%d dropped), %d delivered, %d queued; want 2, 0, 61, 0", st.Refused, st.RefusedDropped, st.Delivered, st.Queued)
	}
	// The records set aside are kept under the outbound directory, with
	// their reasons, across a restart.
	f2 := txnForwarder(t, dir, addrs, bridge.Options{})
	var got []bridge.RefusedRecord
	if err := f2.ReadRefused(func(r bridge.RefusedRecord) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("refused store holds %d records, want 2", len(got))
	}
	for i, want := range []struct {
		seq    uint64
		key    string
		value  []byte
		reason string
	}{
		{31, "gw-1/big", refusedByKafka, "MESSAGE_TOO_LARGE"},
		{32, "gw-1/huge", tooLarge, "over kafka.max_record_bytes (524288)"},
	} {
		r := got[i]
		if r.Seq != want.seq || r.Record.Topic != dead || string(r.Record.Key) != want.key || !bytes.Equal(r.Record.Value, want.value) ||
			!strings.Contains(r.Reason, want.reason) || time.Since(r.At) > time.Minute {
			t.Errorf("refused record %d: seq %d topic %s key %s, %d bytes, reason %q; want seq %d key %s, %d bytes, reason with %q",
				i, r.Seq, r.Record.Topic, r.Record.Key, len(r.Record.Value), r.Reason, want.seq, want.key, len(want.value), want.reason)
		}
	}
	if st := f2.Stats(); st.Queued != 0 || st.RefusedBytes < 750_000 {
		t.Errorf("after restart: %d queued, refused store %d bytes; want 0 and both records", st.Queued, st.RefusedBytes)
	}
	stop2 := run(t, f2)
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
}

// TestPoisonRecordAmongOthers: Kafka refuses a partition's records of a
// request together. The dead-letter topic takes at most 3,000 bytes per
// batch; a 5,000-byte record and a small one after it go in one batch with
// summaries, and the broker refuses both dead letters. The forwarder sends
// the records before the first refused one, then that one alone, sets it
// aside, and delivers the innocent small one and the rest exactly once.
func TestPoisonRecordAmongOthers(t *testing.T) {
	_, addrs := kafkatest.Start(t, 1, summaries, dead, offsetsTopic)
	admin, err := sarama.NewClusterAdmin(addrs, kafka.ReadConfig("test-admin"))
	if err != nil {
		t.Fatal(err)
	}
	limit := "3000"
	if err := admin.AlterConfig(sarama.TopicResource, dead, map[string]*string{"max.message.bytes": &limit}, false); err != nil {
		t.Fatalf("set the dead-letter topic's max.message.bytes: %v", err)
	}
	admin.Close()
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{})
	for m := 0; m < 20; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	poison := noise(3, 5000)
	f.Enqueue(bridge.Record{Topic: dead, Key: []byte("gw-1/poison"), Value: poison}, bridge.Mark{})
	f.Enqueue(bridge.Record{Topic: dead, Key: []byte("gw-1/small"), Value: []byte("innocent neighbour")}, bridge.Mark{})
	for m := 20; m < 40; m++ {
		f.Summary(summary("d", m), bridge.Mark{})
	}
	stop := run(t, f)
	msgs, cerr := kafkatest.ConsumeN(addrs, summaries, 40, 20*time.Second)
	st := f.Stats()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if cerr != nil {
		t.Fatalf("%d of 40 summaries delivered in 20 s (%v); stats %+v", len(msgs), cerr, st)
	}
	if got := minutesOf(t, msgs); fmt.Sprint(got) != fmt.Sprint(span(0, 40)) {
		t.Errorf("read_committed consumer sees summaries %v, want 0..39 once each", got)
	}
	dl := kafkatest.Consume(t, addrs, dead, 1, 10*time.Second)
	if len(dl) != 1 || string(dl[0].Value) != "innocent neighbour" {
		t.Errorf("dead-letter topic holds %d records (first %.40q), want only the innocent one", len(dl), dl[0].Value)
	}
	if st.Refused != 1 || st.Delivered != 41 {
		t.Errorf("stats: %d refused, %d delivered; want 1 and 41", st.Refused, st.Delivered)
	}
}
