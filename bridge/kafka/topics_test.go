package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
)

// cluster starts kfake with n brokers and no topics.
func cluster(t *testing.T, n int) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

func createTopic(t *testing.T, c *kfake.Cluster, topic string, cfg map[string]string) {
	t.Helper()
	if err := c.CreateTopic(topic, 1, cfg); err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
}

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// connectOnce connects with connect and returns the producer's warnings.
func connectOnce(t *testing.T, connect bridge.Connector) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return p.(bridge.Warner).Warnings(), nil
}

func gwOptions(brokers []string, exactlyOnce bool) kafka.Options {
	o := kafka.Options{Brokers: brokers, ClientID: "test", DataTopics: []string{summaries, dead}}
	if exactlyOnce {
		o.TransactionalID, o.OffsetsTopic, o.PositionKey = "edgegate-gw-1", offsets, "gw-1"
	}
	return o
}

// TestOffsetsTopicMustKeepPositions: a connection is refused while the
// offsets topic is not compacted, or deletes records by retention: a
// gateway that delivered nothing for the retention time would lose its
// position and send its queue again. The error names the topic, the
// setting and the kafka-configs command that fixes it.
func TestOffsetsTopicMustKeepPositions(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  map[string]string
		once bool   // exactly-once delivery
		want string // in the error; "" for none
	}{
		"compact":                  {cfg: map[string]string{"cleanup.policy": "compact"}, once: true},
		"kafka's default: delete":  {cfg: nil, once: true, want: "kafka.offsets_topic edge.offsets has cleanup.policy=delete: Kafka deletes its records after retention.ms=604800000"},
		"compact,delete":           {cfg: map[string]string{"cleanup.policy": "compact,delete"}, once: true, want: "has cleanup.policy=compact,delete: Kafka deletes its records after retention.ms=604800000"},
		"compact,delete, retained": {cfg: map[string]string{"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}, once: true},
		"delete, retained":         {cfg: map[string]string{"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}, once: true, want: "the topic grows for good"},
		"not exactly-once":         {cfg: nil, once: false},
	} {
		t.Run(name, func(t *testing.T) {
			c, brokers := cluster(t, 1)
			createTopic(t, c, offsets, tc.cfg)
			createTopic(t, c, summaries, nil)
			createTopic(t, c, dead, nil)
			_, err := connectOnce(t, kafka.NewConnector(gwOptions(brokers, tc.once)))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				return
			}
			fix := "kafka-configs.sh --bootstrap-server " + brokers[0] + " --alter --entity-type topics --entity-name edge.offsets --add-config cleanup.policy=compact"
			if !errors.Is(err, kafka.ErrTopicConfig) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fix) {
				t.Errorf("connect: %v\nwant ErrTopicConfig saying %q and %q", err, tc.want, fix)
			}
		})
	}
}

// TestDurabilityWarnings: on a cluster of three brokers, a topic with
// min.insync.replicas=1 (Kafka's default) or unclean leader election
// could lose a committed batch while its position survives: each is
// warned of, once per connector however often it connects, naming the
// topic and the fix. One broker, or min.insync.replicas=2, warns of
// nothing.
func TestDurabilityWarnings(t *testing.T) {
	insync2 := map[string]string{"min.insync.replicas": "2"}
	t.Run("min.insync.replicas", func(t *testing.T) {
		c, brokers := cluster(t, 3)
		createTopic(t, c, offsets, kafka.OffsetsTopicConfig)
		createTopic(t, c, summaries, nil)
		createTopic(t, c, dead, insync2)
		var log logBuffer
		o := gwOptions(brokers, true)
		o.Logger = slog.New(slog.NewTextHandler(&log, nil))
		connect := kafka.NewConnector(o)
		for range 2 {
			w, err := connectOnce(t, connect)
			if err != nil {
				t.Fatal(err)
			}
			if len(w) != 2 || !strings.HasPrefix(w[0], "kafka topic edge.offsets: min.insync.replicas=1 on a cluster of 3 brokers") ||
				!strings.HasPrefix(w[1], "kafka topic edge.summaries: min.insync.replicas=1") || !strings.Contains(w[1], "--add-config min.insync.replicas=2") {
				t.Errorf("warnings %q", w)
			}
		}
		if n := strings.Count(log.String(), "level=WARN"); n != 2 {
			t.Errorf("%d warnings logged over two connections, want 2 (once each):\n%s", n, log.String())
		}
	})
	t.Run("one broker", func(t *testing.T) {
		c, brokers := cluster(t, 1)
		createTopic(t, c, offsets, kafka.OffsetsTopicConfig)
		createTopic(t, c, summaries, nil)
		createTopic(t, c, dead, nil)
		if w, err := connectOnce(t, kafka.NewConnector(gwOptions(brokers, true))); err != nil || len(w) != 0 {
			t.Errorf("warnings %q, err %v; want none", w, err)
		}
	})
	t.Run("unclean leader election", func(t *testing.T) {
		c, brokers := cluster(t, 3)
		createTopic(t, c, offsets, kafka.OffsetsTopicConfig)
		createTopic(t, c, summaries, insync2)
		createTopic(t, c, dead, insync2)
		// kfake knows no unclean.leader.election.enable: answer as a
		// broker where the summaries topic has it on.
		c.ControlKey(kmsg.DescribeConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
			for _, rr := range req.(*kmsg.DescribeConfigsRequest).Resources {
				r := kmsg.NewDescribeConfigsResponseResource()
				r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
				add := func(k, v string) {
					e := kmsg.NewDescribeConfigsResponseResourceConfig()
					e.Name, e.Value = k, kmsg.StringPtr(v)
					r.Configs = append(r.Configs, e)
				}
				add("cleanup.policy", map[bool]string{true: "compact", false: "delete"}[rr.ResourceName == offsets])
				add("min.insync.replicas", "2")
				add("unclean.leader.election.enable", map[bool]string{true: "true", false: "false"}[rr.ResourceName == summaries])
				resp.Resources = append(resp.Resources, r)
			}
			return resp, nil, true
		})
		w, err := connectOnce(t, kafka.NewConnector(gwOptions(brokers, true)))
		if err != nil || len(w) != 1 || !strings.HasPrefix(w[0], "kafka topic edge.summaries: unclean.leader.election.enable=true") {
			t.Errorf("warnings %q, err %v; want one of unclean leader election on edge.summaries", w, err)
		}
	})
}

// TestDescribeConfigsRefused: a broker that does not let the gateway
// describe topic settings (no DescribeConfigs ACL) leaves them unchecked,
// with a warning per topic, and the connection goes on.
func TestDescribeConfigsRefused(t *testing.T) {
	c, brokers := cluster(t, 1)
	for _, topic := range []string{offsets, summaries, dead} {
		createTopic(t, c, topic, nil) // not even compacted: unchecked
	}
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
	w, err := connectOnce(t, kafka.NewConnector(gwOptions(brokers, true)))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	slices.Sort(w)
	if len(w) != 3 || !strings.HasPrefix(w[0], "kafka topic edge.deadletter: settings not checked: DescribeConfigs refused (kafka server: The client is not authorized to access this topic") ||
		!strings.Contains(w[0], "allow this gateway's user DescribeConfigs on the topic") {
		t.Errorf("warnings %q", w)
	}
}
