package bridge_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// TestOffsetsTopicNotCompacted: while the offsets topic has Kafka's
// default cleanup.policy (delete), the forwarder delivers nothing and
// says why in Stats.LinkError; once the topic is made compacted (as the
// error's kafka-configs command does), delivery starts without a
// restart.
func TestOffsetsTopicNotCompacted(t *testing.T) {
	c, addrs := kafkatest.Start(t, 1, summaries, dead)
	if err := c.CreateTopic(offsetsTopic, 1, nil); err != nil {
		t.Fatal(err)
	}
	f := txnForwarder(t, t.TempDir(), addrs, bridge.Options{})
	stop := run(t, f)
	defer stop()
	f.Summary(summary("d", 0), bridge.Mark{})
	deadline := time.Now().Add(30 * time.Second) // for a forwarder that never finds it, not a slow one
	for !strings.Contains(f.Stats().LinkError, "cleanup.policy=delete") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := f.Stats(); !strings.Contains(st.LinkError, "kafka.offsets_topic edge.offsets has cleanup.policy=delete") || st.Delivered != 0 || st.LinkUp {
		t.Fatalf("with a deleting offsets topic: link error %q, %d delivered, link up %v", st.LinkError, st.Delivered, st.LinkUp)
	}
	admin, err := sarama.NewClusterAdmin(addrs, kafka.ReadConfig("test-admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	compact := "compact"
	if err := admin.IncrementalAlterConfig(sarama.TopicResource, offsetsTopic,
		map[string]sarama.IncrementalAlterConfigsEntry{"cleanup.policy": {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &compact}}, false); err != nil {
		t.Fatal(err)
	}
	kafkatest.Consume(t, addrs, summaries, 1, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := f.Stats(); st.LinkError != "" && st.LinkUp {
		t.Errorf("after the fix: link error %q", st.LinkError)
	}
}

// TestKafkaWarningsInStats: on three brokers with min.insync.replicas=1,
// the forwarder delivers and shows the warnings in its stats.
func TestKafkaWarningsInStats(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kafkatest.CreateTopics(t, c, 1, summaries, dead, offsetsTopic)
	addrs := c.ListenAddrs()
	f, err := bridge.NewForwarder(bridge.Options{Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead, Dir: t.TempDir()},
		kafka.NewConnector(kafka.Options{Brokers: addrs, ClientID: "test", TransactionalID: "edgegate-gw-1", OffsetsTopic: offsetsTopic,
			PositionKey: "gw-1", DataTopics: []string{summaries, dead}}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, f)
	f.Summary(summary("d", 0), bridge.Mark{})
	kafkatest.Consume(t, addrs, summaries, 1, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	w := f.Stats().KafkaWarnings
	if len(w) != 3 {
		t.Fatalf("warnings %q, want one per topic", w)
	}
	for i, topic := range []string{offsetsTopic, summaries, dead} {
		if !strings.HasPrefix(w[i], "kafka topic "+topic+": min.insync.replicas=1 on a cluster of 3 brokers") {
			t.Errorf("warning %d: %q", i, w[i])
		}
	}
}
