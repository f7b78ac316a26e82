package kafka

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
)

// OffsetsTopicConfig is the configuration the offsets topic needs, as
// kafka-configs and CreateTopics take it: compacted, so that each
// gateway's newest position record is kept however long ago it was
// written, and nothing else deleted.
var OffsetsTopicConfig = map[string]string{"cleanup.policy": "compact"}

// ErrTopicConfig wraps what connect returns when a topic's configuration
// breaks exactly-once delivery (the offsets topic not compacted, or its
// positions deleted by retention). It is not a link failure: the
// connection is refused until the topic is fixed (each attempt checks
// again).
var ErrTopicConfig = errors.New("kafka topic configuration breaks exactly-once delivery")

// checkTopics describes the configuration of the offsets topic and of the
// data topics (Options.DataTopics) and checks what exactly-once delivery
// depends on:
//
//   - the offsets topic's cleanup.policy includes compact, and delete only
//     if retention deletes nothing (retention.ms and retention.bytes -1):
//     otherwise a gateway that delivers nothing for retention.ms (an
//     outage, a gateway in storage) loses its delivered position and sends
//     its queue again (an error, ErrTopicConfig);
//   - on a cluster of more than one broker, no topic has
//     unclean.leader.election.enable=true or min.insync.replicas below 2:
//     either could lose records Kafka acknowledged, a committed batch
//     among them while its position record (on another partition)
//     survives, and then the batch is lost, not sent again (a warning).
//
// A broker that refuses DescribeConfigs (no DescribeConfigs ACL) leaves
// the topics unchecked, with a warning. It returns the warnings.
func checkTopics(client sarama.Client, o Options) ([]string, error) {
	var topics []string
	if o.TransactionalID != "" {
		topics = append(topics, o.OffsetsTopic)
	}
	for _, t := range o.DataTopics {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	admin, err := sarama.NewClusterAdminFromClient(client) // not closed: that would close client
	if err != nil {
		return []string{fmt.Sprintf("kafka topic settings not checked: %v", err)}, nil
	}
	resources := make([]*sarama.ConfigResource, len(topics))
	for i, t := range topics {
		resources[i] = &sarama.ConfigResource{Type: sarama.TopicResource, Name: t}
	}
	results, err := admin.DescribeConfigs(resources, sarama.DescribeConfigsOptions{})
	if err != nil {
		return []string{fmt.Sprintf("kafka topic settings not checked (DescribeConfigs: %v); "+
			"exactly-once delivery needs %s compacted and acknowledged records never lost", err, o.OffsetsTopic)}, nil
	}
	multi := len(client.Brokers()) > 1
	var warnings []string
	for _, r := range results {
		if r.ErrorCode != 0 {
			warnings = append(warnings, fmt.Sprintf("kafka topic %s: settings not checked: DescribeConfigs refused (%v%s); "+
				"allow this gateway's user DescribeConfigs on the topic to have them checked", r.Name, sarama.KError(r.ErrorCode), errMsg(r.ErrorMsg)))
			continue
		}
		cfg := map[string]string{}
		for _, e := range r.Configs {
			cfg[e.Name] = e.Value
		}
		if o.TransactionalID != "" && r.Name == o.OffsetsTopic {
			if _, ok := cfg["cleanup.policy"]; !ok {
				warnings = append(warnings, fmt.Sprintf("kafka topic %s: cleanup.policy not checked: the broker did not say it", r.Name))
			} else if err := checkOffsetsTopic(r.Name, cfg, o); err != nil {
				return warnings, err
			}
		}
		if !multi {
			continue
		}
		if cfg["unclean.leader.election.enable"] == "true" {
			warnings = append(warnings, fmt.Sprintf("kafka topic %s: unclean.leader.election.enable=true: after a broker failure an out-of-sync replica may lead "+
				"and drop records Kafka acknowledged, a committed batch among them while its delivered position survives, and that batch is then lost, not sent again; "+
				"set it to false (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config unclean.leader.election.enable=false)", r.Name, r.Name))
		}
		if n, err := strconv.Atoi(cfg["min.insync.replicas"]); err == nil && n < 2 {
			warnings = append(warnings, fmt.Sprintf("kafka topic %s: min.insync.replicas=%d on a cluster of %d brokers: Kafka acknowledges a record held by one broker, "+
				"and losing that broker's disk loses a committed batch while its delivered position may survive; "+
				"set min.insync.replicas=2 with a replication factor of 3 (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config min.insync.replicas=2)",
				r.Name, n, len(client.Brokers()), r.Name))
		}
	}
	return warnings, nil
}

func errMsg(m string) string {
	if m == "" {
		return ""
	}
	return ": " + m
}

// checkOffsetsTopic checks that the offsets topic keeps each key's newest
// record for good.
func checkOffsetsTopic(name string, cfg map[string]string, o Options) error {
	policy := cfg["cleanup.policy"]
	var compact, del bool
	for _, p := range strings.Split(policy, ",") {
		switch strings.TrimSpace(p) {
		case "compact":
			compact = true
		case "delete":
			del = true
		}
	}
	deletes := del && (cfg["retention.ms"] != "-1" || cfg["retention.bytes"] != "-1")
	if compact && !deletes {
		return nil
	}
	why := "Kafka keeps all of it and never drops an old position record: the topic grows for good, and every gateway reads it from the start at each connection"
	if deletes {
		why = fmt.Sprintf("Kafka deletes its records after retention.ms=%s (or beyond retention.bytes=%s), a gateway's newest position among them "+
			"once it delivers nothing for that long (an outage, a gateway in storage), and that gateway then sends its whole queue again", cfg["retention.ms"], cfg["retention.bytes"])
	}
	bootstrap := "BROKER:9092"
	if len(o.Brokers) > 0 {
		bootstrap = o.Brokers[0]
	}
	return fmt.Errorf("%w: kafka.offsets_topic %s has cleanup.policy=%s: %s. Make it compacted: "+
		"kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact",
		ErrTopicConfig, name, policy, why, bootstrap, name)
}
