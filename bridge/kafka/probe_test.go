package kafka_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs/testpki"
)

// noLeaks fails the test if a goroutine it started outlives it. Called
// first, its check runs after every other cleanup (kfake's Close among
// them).
func noLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

func probe(t *testing.T, o kafka.Options) kafka.ProbeReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := kafka.Probe(ctx, o)
	t.Logf("%s", r.Line())
	return r
}

// want is a step as a test expects it: state is ok, failed or skipped;
// detail is matched whole, each * in it matching any text.
type want struct{ name, state, detail string }

func checkSteps(t *testing.T, r kafka.ProbeReport, steps ...want) {
	t.Helper()
	if len(r.Steps) != len(steps) {
		t.Fatalf("%d steps, want %d: %+v", len(r.Steps), len(steps), r.Steps)
	}
	for i, s := range r.Steps {
		state := "failed"
		switch {
		case s.OK && s.Skipped:
			state = "ok and skipped"
		case s.OK:
			state = "ok"
		case s.Skipped:
			state = "skipped"
		}
		w := steps[i]
		if s.Name != w.name || state != w.state || !glob(w.detail, s.Detail) {
			t.Errorf("step %d: %s %s: %q\nwant     %s %s: %q", i, s.Name, state, s.Detail, w.name, w.state, w.detail)
		}
		if (state == "failed") != (s.Err != nil) || s.Err != nil && s.Err.Error() != s.Detail {
			t.Errorf("step %s: %s with Err %v", s.Name, state, s.Err)
		}
	}
}

// glob reports whether s is pattern, each * in which matches any text.
func glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return s == pattern
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// checkFailed checks that r's error is its step's failure.
func checkFailed(t *testing.T, r kafka.ProbeReport, step string) error {
	t.Helper()
	err := r.Err()
	if err == nil {
		t.Fatal("Err() = nil")
	}
	var detail string
	for _, s := range r.Steps {
		if s.Name == step {
			detail = s.Detail
		}
	}
	if err.Error() != "kafka probe failed at "+step+": "+detail || !glob(err.Error()+" (* s)", r.Line()) {
		t.Errorf("Err() = %v\nLine() = %s", err, r.Line())
	}
	return err
}

const notExactlyOnce = "not checked: no transactional id (kafka.exactly_once is off)"

// TestProbeAllGood: a cluster the gateway can deliver to exactly-once
// passes every step, and the probe neither produces, nor initialises a
// producer id, nor asks for a topic to be created.
func TestProbeAllGood(t *testing.T) {
	noLeaks(t)
	c, brokers := kafkatest.Start(t, 2, summaries, dead, offsets)
	var mu sync.Mutex
	keys := map[kmsg.Key]int{}
	autoCreate := false
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		keys[kmsg.Key(req.Key())]++
		if m, ok := req.(*kmsg.MetadataRequest); ok && m.AllowAutoTopicCreation {
			autoCreate = true
		}
		return nil, nil, false
	})
	r := probe(t, gwOptions(brokers, true))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "ok", "edge.offsets compacted"},
		want{"transactional id", "ok", "coordinator of edgegate-gw-1 is broker 0 at " + brokers[0]},
	)
	if err := r.Err(); err != nil || len(r.Warnings) != 0 {
		t.Errorf("Err() = %v, warnings %q", err, r.Warnings)
	}
	line := "kafka reachable: 1 of 1 brokers answered (" + brokers[0] + "); authenticated: no SASL configured (kafka.sasl), no TLS; " +
		"topics: edge.summaries, edge.deadletter, edge.offsets present; offsets topic: edge.offsets compacted; " +
		"transactional id: coordinator of edgegate-gw-1 is broker 0 at " + brokers[0] + " (0.* s)"
	if !glob(line, r.Line()) {
		t.Errorf("Line() = %s\nwant      %s", r.Line(), line)
	}
	mu.Lock()
	defer mu.Unlock()
	if keys[kmsg.FindCoordinator] == 0 || keys[kmsg.DescribeConfigs] == 0 || keys[kmsg.InitProducerID] != 0 ||
		keys[kmsg.CreateTopics] != 0 || keys[kmsg.Produce] != 0 || autoCreate {
		t.Errorf("requests %v (auto-creation asked: %v); want FindCoordinator and DescribeConfigs, and no InitProducerId, CreateTopics or Produce", keys, autoCreate)
	}
}

// TestProbeOneBrokerDown: one bootstrap broker answering is enough; the
// one that does not is named with its dial error.
func TestProbeOneBrokerDown(t *testing.T) {
	noLeaks(t)
	_, brokers := kafkatest.Start(t, 1, summaries, dead)
	down := kafkatest.Addr(kafkatest.FreePort(t))
	r := probe(t, gwOptions([]string{down, brokers[0]}, false))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 2 brokers answered (" + brokers[0] + "); " + down + ": dial tcp " + down + ": connect: connection refused"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter present"},
		want{"offsets topic", "skipped", notExactlyOnce},
		want{"transactional id", "skipped", notExactlyOnce},
	)
	if err := r.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
}

// TestProbeThreeBrokers: on a cluster of three, every bootstrap broker
// is dialled, the transaction coordinator may be another broker than the
// one asked, and checkTopics' durability warnings are the report's; the
// probe passes.
func TestProbeThreeBrokers(t *testing.T) {
	noLeaks(t)
	c, brokers := cluster(t, 3)
	createTopic(t, c, offsets, kafka.OffsetsTopicConfig)
	createTopic(t, c, summaries, nil)
	createTopic(t, c, dead, nil)
	r := probe(t, gwOptions(brokers, true))
	node := c.CoordinatorFor("edgegate-gw-1")
	checkSteps(t, r,
		want{"reachable", "ok", "3 of 3 brokers answered (" + strings.Join(brokers, ", ") + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "ok", "edge.offsets compacted"},
		want{"transactional id", "ok", fmt.Sprintf("coordinator of edgegate-gw-1 is broker %d at %s", node, brokers[node])},
	)
	if err := r.Err(); err != nil || len(r.Warnings) != 3 || !strings.HasPrefix(r.Warnings[0], "kafka topic edge.offsets: min.insync.replicas=1 on a cluster of 3 brokers") ||
		!glob("kafka reachable: *; warnings: 3 (* s)", r.Line()) {
		t.Errorf("Err() = %v, warnings %q, line %s", err, r.Warnings, r.Line())
	}
}

// TestProbeSecure: SASL SCRAM-SHA-512 over TLS passes, and says so.
func TestProbeSecure(t *testing.T) {
	noLeaks(t)
	ca := testpki.New(t, "kafka-ca")
	brokers := secureCluster(t, ca, map[string]string{"SCRAM-SHA-512": "s3cret"})
	o := gwOptions(brokers, true)
	o.SASL = &kafka.SASL{Mechanism: "SCRAM-SHA-512", User: "gw", Password: "s3cret"}
	o.TLS = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	r := probe(t, o)
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered over TLS (" + brokers[0] + ")"},
		want{"authenticated", "ok", `SASL SCRAM-SHA-512 as "gw", over TLS`},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "ok", "edge.offsets compacted"},
		want{"transactional id", "ok", "coordinator of edgegate-gw-1 is broker 0 at " + brokers[0]},
	)
	if err := r.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
}

// TestProbeNothingListening: with no broker up, reachable fails at once
// (not after sarama's retries), naming the address and the dial error.
func TestProbeNothingListening(t *testing.T) {
	noLeaks(t)
	addr := kafkatest.Addr(kafkatest.FreePort(t))
	r := probe(t, gwOptions([]string{addr}, true))
	checkSteps(t, r,
		want{"reachable", "failed", "no broker answered (check kafka.brokers, and that Kafka runs and this host may reach it): " +
			addr + ": dial tcp " + addr + ": connect: connection refused"},
		want{"authenticated", "skipped", "not checked: reachable failed"},
		want{"topics", "skipped", "not checked: reachable failed"},
		want{"offsets topic", "skipped", "not checked: reachable failed"},
		want{"transactional id", "skipped", "not checked: reachable failed"},
	)
	err := checkFailed(t, r, "reachable")
	if !strings.Contains(err.Error(), addr) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Err() = %v; want it to name %s and wrap ECONNREFUSED", err, addr)
	}
	if r.Took > 5*time.Second { // no retries, no waiting out a timeout (10 s and more)
		t.Errorf("took %v against a refused port", r.Took)
	}
}

// TestProbeTLSUnknownCA: brokers whose certificate the gateway cannot
// verify fail reachable, pointing at kafka.tls.ca_file.
func TestProbeTLSUnknownCA(t *testing.T) {
	noLeaks(t)
	brokers := secureCluster(t, testpki.New(t, "kafka-ca"), nil)
	o := gwOptions(brokers, false)
	o.TLS = &tls.Config{RootCAs: testpki.New(t, "other").Pool(), MinVersion: tls.VersionTLS12}
	r := probe(t, o)
	checkSteps(t, r,
		want{"reachable", "failed", "no broker answered over TLS (check kafka.brokers, kafka.tls.ca_file and the brokers' certificates): " +
			brokers[0] + ": tls: failed to verify certificate: x509: certificate signed by unknown authority*"},
		want{"authenticated", "skipped", "not checked: reachable failed"},
		want{"topics", "skipped", "not checked: reachable failed"},
		want{"offsets topic", "skipped", "not checked: reachable failed"},
		want{"transactional id", "skipped", "not checked: reachable failed"},
	)
	checkFailed(t, r, "reachable")
}

// TestProbeWrongPassword: kfake closes the connection on a bad password;
// the probe says to check kafka.sasl.username and the password, and never
// shows the password.
func TestProbeWrongPassword(t *testing.T) {
	noLeaks(t)
	brokers := secureCluster(t, nil, map[string]string{"SCRAM-SHA-512": "right-password"})
	o := gwOptions(brokers, true)
	o.SASL = &kafka.SASL{Mechanism: "SCRAM-SHA-512", User: "gw", Password: "wrong-password"}
	r := probe(t, o)
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "failed", `no Kafka broker accepted the connection: authentication failed? (SASL SCRAM-SHA-512 as "gw"; ` +
			"check kafka.sasl.username and the password, and that the brokers offer SCRAM-SHA-512): kafka: client has run out of available brokers*"},
		want{"topics", "skipped", "not checked: authenticated failed"},
		want{"offsets topic", "skipped", "not checked: authenticated failed"},
		want{"transactional id", "skipped", "not checked: authenticated failed"},
	)
	err := checkFailed(t, r, "authenticated")
	if !errors.Is(err, sarama.ErrOutOfBrokers) || strings.Contains(r.Line(), "wrong-password") {
		t.Errorf("Err() = %v; want sarama's ErrOutOfBrokers wrapped, and no password", err)
	}
}

// TestProbeMissingTopics: each missing topic is named with the command
// that creates it (the offsets topic compacted). kfake here creates a
// topic when a metadata request allows it: the probe must not have
// created them.
func TestProbeMissingTopics(t *testing.T) {
	noLeaks(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kafkatest.CreateTopics(t, c, 1, summaries)
	brokers := c.ListenAddrs()
	for range 2 { // the second finds them missing still
		r := probe(t, gwOptions(brokers, true))
		checkSteps(t, r,
			want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
			want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
			want{"topics", "failed", "topic edge.deadletter does not exist (create it: kafka-topics.sh --bootstrap-server " + brokers[0] + " --create --topic edge.deadletter); " +
				"topic edge.offsets does not exist (create it: kafka-topics.sh --bootstrap-server " + brokers[0] + " --create --topic edge.offsets --config cleanup.policy=compact)"},
			want{"offsets topic", "skipped", "not checked: topics failed"},
			want{"transactional id", "skipped", "not checked: topics failed"},
		)
		if err := checkFailed(t, r, "topics"); !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			t.Errorf("Err() = %v; want sarama's ErrUnknownTopicOrPartition wrapped", err)
		}
	}
	for _, topic := range []string{dead, offsets} {
		if c.TopicInfo(topic) != nil {
			t.Errorf("the probe created %s", topic)
		}
	}
}

// TestProbeOffsetsTopicNotCompacted: an offsets topic that would lose
// positions fails as a connection would (ErrTopicConfig).
func TestProbeOffsetsTopicNotCompacted(t *testing.T) {
	noLeaks(t)
	c, brokers := cluster(t, 1)
	createTopic(t, c, offsets, nil) // Kafka's default: delete
	createTopic(t, c, summaries, nil)
	createTopic(t, c, dead, nil)
	r := probe(t, gwOptions(brokers, true))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "failed", "kafka topic configuration breaks exactly-once delivery: kafka.offsets_topic edge.offsets has cleanup.policy=delete: *" +
			"kafka-configs.sh --bootstrap-server " + brokers[0] + " --alter --entity-type topics --entity-name edge.offsets --add-config cleanup.policy=compact"},
		want{"transactional id", "skipped", "not checked: offsets topic failed"},
	)
	if err := checkFailed(t, r, "offsets topic"); !errors.Is(err, kafka.ErrTopicConfig) {
		t.Errorf("Err() = %v; want ErrTopicConfig", err)
	}
}

// TestProbeAtLeastOnce: without a transactional id there is no offsets
// topic to check (nor to have) and no id: both steps are skipped, and the
// probe passes.
func TestProbeAtLeastOnce(t *testing.T) {
	noLeaks(t)
	_, brokers := kafkatest.Start(t, 1, summaries, dead)
	r := probe(t, gwOptions(brokers, false))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter present"},
		want{"offsets topic", "skipped", notExactlyOnce},
		want{"transactional id", "skipped", notExactlyOnce},
	)
	if err := r.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
	if !glob("kafka reachable: *; offsets topic: "+notExactlyOnce+"; transactional id: "+notExactlyOnce+" (* s)", r.Line()) {
		t.Errorf("Line() = %s", r.Line())
	}
}

// TestProbeDescribeConfigsRefused: a broker that will not tell the
// topics' settings leaves the offsets topic unchecked, as a connection
// does: skipped, with checkTopics' warnings, and the probe passes.
func TestProbeDescribeConfigsRefused(t *testing.T) {
	noLeaks(t)
	c, brokers := kafkatest.Start(t, 1, summaries, dead, offsets)
	c.ControlKey(kmsg.DescribeConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range req.(*kmsg.DescribeConfigsRequest).Resources {
			r := kmsg.NewDescribeConfigsResponseResource()
			r.ResourceType, r.ResourceName, r.ErrorCode = rr.ResourceType, rr.ResourceName, 29 // TOPIC_AUTHORIZATION_FAILED
			resp.Resources = append(resp.Resources, r)
		}
		return resp, nil, true
	})
	r := probe(t, gwOptions(brokers, true))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "skipped", "not checked: kafka topic edge.offsets: settings not checked: DescribeConfigs refused (*"},
		want{"transactional id", "ok", "coordinator of edgegate-gw-1 is broker 0 at " + brokers[0]},
	)
	if err := r.Err(); err != nil || len(r.Warnings) != 3 || !strings.HasSuffix(r.Line()[:strings.LastIndex(r.Line(), " (")], "; warnings: 3") {
		t.Errorf("Err() = %v, warnings %q, line %s", err, r.Warnings, r.Line())
	}
}

// TestProbeACLs: kfake with ACLs. User gw may use every transactional id
// starting edgegate- but edgegate-gw-1, which an ACL denies: FindCoordinator
// answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and the probe says which
// ACL to add; another id passes. User nodl may not describe the dead-letter
// topic: the topics step says so.
func TestProbeACLs(t *testing.T) {
	noLeaks(t)
	lit, pre := kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLResourcePatternTypePrefixed
	allTopics := kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "*", Pattern: lit, Operation: kmsg.ACLOperationAll, Allow: true}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.User("SCRAM-SHA-512", "gw", "s3cret", allTopics,
			kfake.ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: "edgegate-", Pattern: pre, Operation: kmsg.ACLOperationAll, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: "edgegate-gw-1", Pattern: lit, Operation: kmsg.ACLOperationAll, Allow: false}),
		kfake.User("SCRAM-SHA-512", "nodl", "s3cret", allTopics,
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: dead, Pattern: lit, Operation: kmsg.ACLOperationAll, Allow: false}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kafkatest.CreateTopics(t, c, 1, summaries, dead, offsets)
	brokers := c.ListenAddrs()
	options := func(user, id string) kafka.Options {
		o := gwOptions(brokers, true)
		o.TransactionalID = id
		o.SASL = &kafka.SASL{Mechanism: "SCRAM-SHA-512", User: user, Password: "s3cret"}
		return o
	}
	steps := func(user string) []want {
		return []want{
			{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
			{"authenticated", "ok", `SASL SCRAM-SHA-512 as "` + user + `", no TLS`},
			{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
			{"offsets topic", "ok", "edge.offsets compacted"},
		}
	}
	t.Run("transactional id denied", func(t *testing.T) {
		r := probe(t, options("gw", "edgegate-gw-1"))
		checkSteps(t, r, append(steps("gw"), want{"transactional id", "failed", "transactional id edgegate-gw-1 refused (kafka server: *): allow User:gw Describe and Write on it " +
			"(kafka-acls.sh --bootstrap-server " + brokers[0] + " --add --allow-principal User:gw --operation Describe --operation Write --transactional-id edgegate-gw-1), " +
			"or turn kafka.exactly_once off"})...)
		if err := checkFailed(t, r, "transactional id"); !errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed) {
			t.Errorf("Err() = %v; want sarama's ErrTransactionalIDAuthorizationFailed wrapped", err)
		}
	})
	t.Run("transactional id allowed", func(t *testing.T) {
		r := probe(t, options("gw", "edgegate-gw-2"))
		checkSteps(t, r, append(steps("gw"), want{"transactional id", "ok", "coordinator of edgegate-gw-2 is broker 0 at " + brokers[0]})...)
		if err := r.Err(); err != nil {
			t.Errorf("Err() = %v", err)
		}
	})
	t.Run("topic denied", func(t *testing.T) {
		r := probe(t, options("nodl", "edgegate-gw-2"))
		s := steps("nodl")[:2]
		s = append(s, want{"topics", "failed", "topic edge.deadletter: not authorized (TOPIC_AUTHORIZATION_FAILED, whether or not it exists): allow User:nodl Describe and Write on it " +
			"(kafka-acls.sh --bootstrap-server " + brokers[0] + " --add --allow-principal User:nodl --operation Describe --operation Write --topic edge.deadletter)"},
			want{"offsets topic", "skipped", "not checked: topics failed"},
			want{"transactional id", "skipped", "not checked: topics failed"})
		checkSteps(t, r, s...)
		if err := checkFailed(t, r, "topics"); !errors.Is(err, sarama.ErrTopicAuthorizationFailed) {
			t.Errorf("Err() = %v; want sarama's ErrTopicAuthorizationFailed wrapped", err)
		}
	})
}

// TestProbeNoTransactionCoordinator: a cluster that has no transaction
// coordinator yet (COORDINATOR_NOT_AVAILABLE, as Kafka answers until it
// has made __transaction_state, or for good when it cannot) fails the
// last step with what to check. sarama sleeps 4 s before it gives up.
func TestProbeNoTransactionCoordinator(t *testing.T) {
	noLeaks(t)
	c, brokers := kafkatest.Start(t, 1, summaries, dead, offsets)
	c.ControlKey(kmsg.FindCoordinator.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
		resp.ErrorCode = 15 // COORDINATOR_NOT_AVAILABLE
		return resp, nil, true
	})
	r := probe(t, gwOptions(brokers, true))
	checkSteps(t, r,
		want{"reachable", "ok", "1 of 1 brokers answered (" + brokers[0] + ")"},
		want{"authenticated", "ok", "no SASL configured (kafka.sasl), no TLS"},
		want{"topics", "ok", "edge.summaries, edge.deadletter, edge.offsets present"},
		want{"offsets topic", "ok", "edge.offsets compacted"},
		want{"transactional id", "failed", "no transaction coordinator for edgegate-gw-1 yet (kafka server: *): Kafka makes its __transaction_state topic " +
			"at the first use of transactions, and cannot while the brokers' transaction.state.log.replication.factor (default 3) or " +
			"transaction.state.log.min.isr exceeds the number of brokers; probe again, and check those settings if this persists"},
	)
	if err := checkFailed(t, r, "transactional id"); !errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) {
		t.Errorf("Err() = %v; want sarama's ErrConsumerCoordinatorNotAvailable wrapped", err)
	}
}

// silentBroker accepts connections and never answers; it reports how
// many of them the other side has not closed.
func silentBroker(t *testing.T) (addr string, open func() int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			n.Add(1)
			wg.Go(func() {
				defer n.Add(-1)
				var b [512]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String(), n.Load
}

// TestProbeStops: ctx bounds the probe. Cancelled before it starts, it
// fails the first step; a deadline that passes while sarama waits for a
// broker that never answers fails the step under way, and the probe
// returns about then, its connections closed.
func TestProbeStops(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		noLeaks(t)
		_, brokers := kafkatest.Start(t, 1, summaries, dead, offsets)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := kafka.Probe(ctx, gwOptions(brokers, true))
		checkSteps(t, r,
			want{"reachable", "failed", "stopped: context canceled"},
			want{"authenticated", "skipped", "not checked: reachable failed"},
			want{"topics", "skipped", "not checked: reachable failed"},
			want{"offsets topic", "skipped", "not checked: reachable failed"},
			want{"transactional id", "skipped", "not checked: reachable failed"},
		)
		if err := checkFailed(t, r, "reachable"); !errors.Is(err, context.Canceled) || r.Took > 2*time.Second {
			t.Errorf("Err() = %v after %v; want context.Canceled at once", err, r.Took)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		noLeaks(t)
		addr, open := silentBroker(t)
		// Long enough for a loaded machine to connect (the first step),
		// far below sarama's own timeouts (10 s and more), which a probe
		// that did not stop at the deadline would wait for.
		const deadline = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		r := kafka.Probe(ctx, gwOptions([]string{addr}, true))
		t.Logf("%s", r.Line())
		checkSteps(t, r,
			want{"reachable", "ok", "1 of 1 brokers answered (" + addr + ")"},
			want{"authenticated", "failed", "stopped: context deadline exceeded"},
			want{"topics", "skipped", "not checked: authenticated failed"},
			want{"offsets topic", "skipped", "not checked: authenticated failed"},
			want{"transactional id", "skipped", "not checked: authenticated failed"},
		)
		if err := checkFailed(t, r, "authenticated"); !errors.Is(err, context.DeadlineExceeded) || r.Took < deadline || r.Took > deadline+3*time.Second {
			t.Errorf("Err() = %v after %v; want context.DeadlineExceeded after about %v", err, r.Took, deadline)
		}
		for end := time.Now().Add(10 * time.Second); open() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d connections left open by the probe", open())
			}
		}
	})
}
