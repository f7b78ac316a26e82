package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// ProbeStep is one check of a Probe.
type ProbeStep struct {
	Name    string // "reachable", "authenticated", "topics", "offsets topic", "transactional id"
	OK      bool
	Skipped bool // not checked (an earlier step failed, or it does not apply: e.g. no transactional id)
	// Detail is what was found, or, on failure, the error and the fix
	// (naming the configuration key, e.g. kafka.sasl.username).
	Detail string
	// Err is the failure, whose message Detail is; it wraps sarama's
	// error, ErrTopicConfig or ctx's error where one is the cause. Nil
	// unless the step failed.
	Err error
}

// ProbeReport is what Probe found.
type ProbeReport struct {
	Steps []ProbeStep
	// Warnings are checkTopics' (unclean leader election,
	// min.insync.replicas, DescribeConfigs refused), as a connection logs
	// them.
	Warnings []string
	Took     time.Duration
}

// Err returns nil when every step that ran passed; else an error naming
// the first failed step, wrapping its Err.
func (r ProbeReport) Err() error {
	for _, s := range r.Steps {
		if !s.OK && !s.Skipped {
			return fmt.Errorf("kafka probe failed at %s: %w", s.Name, s.Err)
		}
	}
	return nil
}

// Line says in one line what the probe found, for a log: each step and
// its detail, or the failure.
func (r ProbeReport) Line() string {
	took := fmt.Sprintf(" (%.2f s)", r.Took.Seconds())
	if err := r.Err(); err != nil {
		return err.Error() + took
	}
	steps := make([]string, len(r.Steps))
	for i, s := range r.Steps {
		steps[i] = s.Name + ": " + s.Detail
	}
	line := "kafka " + strings.Join(steps, "; ")
	if len(r.Warnings) > 0 {
		line += fmt.Sprintf("; warnings: %d", len(r.Warnings))
	}
	return line + took
}

// probeReachTimeout bounds each broker's dial (and TLS handshake) in the
// reachable step: a broker that takes longer is as good as down for a
// check someone waits for.
const probeReachTimeout = 3 * time.Second

const notExactlyOnce = "not checked: no transactional id (kafka.exactly_once is off)"

// Probe checks the link to Kafka without producing anything: it never
// creates a topic, never initialises a producer id (that would fence the
// gateway's own producer) and closes everything it opened before it
// returns; ctx bounds it.
//
// The steps, in order, each skipped once one has failed: reachable (a
// TCP dial, with the TLS handshake when o.TLS is set, to each of
// o.Brokers; one answering is enough), authenticated (a sarama client
// with SaramaConfig(o), as NewConnector makes, but that asks no broker
// to create a topic and does not retry), topics (o.DataTopics and, for
// exactly-once delivery, o.OffsetsTopic exist), offsets topic (checkTopics,
// as each connection does; its warnings go to ProbeReport.Warnings) and
// transactional id (its transaction coordinator is found, which Kafka
// refuses to a user the id's ACLs do not allow; Write on the id is not
// checked: only InitProducerId would). A step still running when ctx ends
// fails with ctx's cause.
//
// sarama's requests take no context: the probe's connections are closed
// when ctx ends, which fails them at once, and Probe returns within
// milliseconds; except that once a broker has answered that the
// transaction coordinator is not available, sarama sleeps 4 s (2 s for
// each of __consumer_offsets and __transaction_state it finds missing)
// before it gives up.
func Probe(ctx context.Context, o Options) ProbeReport {
	start := time.Now()
	cfg := SaramaConfig(o)
	dctx, cancel := context.WithCancel(ctx) // ends the dials under way when the probe does
	p := &prober{ctx: ctx, o: o, cfg: cfg,
		dialer: &cutDialer{ctx: dctx, d: net.Dialer{Timeout: cfg.Net.DialTimeout, KeepAlive: cfg.Net.KeepAlive}}}
	stop := context.AfterFunc(ctx, p.dialer.cut)
	steps := []struct {
		name string
		run  func() (detail string, skipped bool, err error)
	}{
		{"reachable", p.reachable},
		{"authenticated", p.authenticate},
		{"topics", p.topics},
		{"offsets topic", p.offsetsTopic},
		{"transactional id", p.transactionalID},
	}
	var r ProbeReport
	failed := ""
	for _, s := range steps {
		if failed != "" {
			r.Steps = append(r.Steps, ProbeStep{Name: s.name, Skipped: true, Detail: "not checked: " + failed + " failed"})
			continue
		}
		detail, skipped, err := s.run()
		if ctx.Err() != nil {
			err = fmt.Errorf("stopped: %w", context.Cause(ctx))
		}
		if err != nil {
			failed = s.name
			r.Steps = append(r.Steps, ProbeStep{Name: s.name, Detail: err.Error(), Err: err})
			continue
		}
		r.Steps = append(r.Steps, ProbeStep{Name: s.name, OK: !skipped, Skipped: skipped, Detail: detail})
	}
	if p.client != nil {
		p.client.Close()
	}
	cancel()
	stop()
	p.dialer.cut() // once it returns, every connection sarama made is closed
	r.Warnings = p.warnings
	r.Took = time.Since(start)
	return r
}

// prober holds what the steps of one Probe share.
type prober struct {
	ctx      context.Context
	o        Options
	cfg      *sarama.Config // SaramaConfig(o), for the client
	dialer   *cutDialer
	client   sarama.Client // made by authenticate
	warnings []string      // of checkTopics
}

// reachable dials every broker at once: the detail says which answered,
// and the failure what each dial found.
func (p *prober) reachable() (string, bool, error) {
	if len(p.o.Brokers) == 0 {
		return "", false, errors.New("no brokers configured (kafka.brokers)")
	}
	errs := make([]error, len(p.o.Brokers))
	var wg sync.WaitGroup
	for i, addr := range p.o.Brokers {
		wg.Go(func() { errs[i] = p.dial(addr) })
	}
	wg.Wait()
	var up []string
	var down causes
	for i, addr := range p.o.Brokers {
		if errs[i] != nil {
			down = append(down, fmt.Errorf("%s: %w", addr, errs[i]))
		} else {
			up = append(up, addr)
		}
	}
	over, check := "", "check kafka.brokers, and that Kafka runs and this host may reach it"
	if p.o.TLS != nil {
		over, check = " over TLS", "check kafka.brokers, kafka.tls.ca_file and the brokers' certificates"
	}
	if len(up) == 0 {
		return "", false, fmt.Errorf("no broker answered%s (%s): %w", over, check, down)
	}
	detail := fmt.Sprintf("%d of %d brokers answered%s (%s)", len(up), len(p.o.Brokers), over, strings.Join(up, ", "))
	if len(down) > 0 {
		detail += "; " + down.Error()
	}
	return detail, false, nil
}

func (p *prober) dial(addr string) error {
	d := &net.Dialer{Timeout: probeReachTimeout}
	var conn net.Conn
	var err error
	if p.o.TLS != nil {
		conn, err = (&tls.Dialer{NetDialer: d, Config: p.o.TLS}).DialContext(p.ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(p.ctx, "tcp", addr)
	}
	if err != nil {
		return err
	}
	conn.Close()
	return nil
}

// authenticate makes the sarama client the later steps use. Its metadata
// requests never ask a broker to create a topic (a broker with
// auto.create.topics.enable would), and it does not retry: a probe says
// what is, and the gateway's connector retries anyway.
func (p *prober) authenticate() (string, bool, error) {
	cfg := p.cfg // as NewConnector's client, but:
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Metadata.Retry.Max = 0
	cfg.Net.Proxy.Enable, cfg.Net.Proxy.Dialer = true, p.dialer
	client, err := sarama.NewClient(p.o.Brokers, cfg)
	if err != nil {
		return "", false, explainError(err, p.o)
	}
	p.client = client
	detail := "no SASL configured (kafka.sasl)"
	if p.o.SASL != nil {
		detail = p.o.SASL.String()
	}
	if p.o.TLS != nil {
		return detail + ", over TLS", false, nil
	}
	return detail + ", no TLS", false, nil
}

// topics asks for each topic's metadata: Kafka answers
// UNKNOWN_TOPIC_OR_PARTITION for one that does not exist.
func (p *prober) topics() (string, bool, error) {
	var present []string
	var missing causes
	for _, t := range p.wanted() {
		err := p.client.RefreshMetadata(t)
		switch {
		case err == nil:
			present = append(present, t)
		case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
			missing = append(missing, explained{fmt.Sprintf("topic %s does not exist (create it: %s)", t, p.createCommand(t)), err})
		case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
			missing = append(missing, explained{fmt.Sprintf("topic %s: not authorized (TOPIC_AUTHORIZATION_FAILED, whether or not it exists): allow %s Describe and Write on it "+
				"(kafka-acls.sh --bootstrap-server %s --add --allow-principal %s --operation Describe --operation Write --topic %s)",
				t, p.principal(), p.o.Brokers[0], p.principal(), t), err})
		default:
			return "", false, fmt.Errorf("metadata of topic %s: %w", t, err)
		}
	}
	if len(missing) > 0 {
		return "", false, missing
	}
	return strings.Join(present, ", ") + " present", false, nil
}

// wanted are the topics the gateway writes to: the data topics, and the
// offsets topic for exactly-once delivery.
func (p *prober) wanted() []string {
	var topics []string
	for _, t := range p.o.DataTopics {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	if p.o.TransactionalID != "" && !slices.Contains(topics, p.o.OffsetsTopic) {
		topics = append(topics, p.o.OffsetsTopic)
	}
	return topics
}

func (p *prober) createCommand(topic string) string {
	cmd := fmt.Sprintf("kafka-topics.sh --bootstrap-server %s --create --topic %s", p.o.Brokers[0], topic)
	if p.o.TransactionalID != "" && topic == p.o.OffsetsTopic {
		for _, k := range slices.Sorted(maps.Keys(OffsetsTopicConfig)) {
			cmd += fmt.Sprintf(" --config %s=%s", k, OffsetsTopicConfig[k])
		}
	}
	return cmd
}

// principal names the gateway's user in ACL advice: its SASL user, or
// a placeholder (without SASL it is the client certificate's name, or
// ANONYMOUS).
func (p *prober) principal() string {
	if p.o.SASL != nil {
		return "User:" + p.o.SASL.User
	}
	return "PRINCIPAL"
}

// offsetsTopic runs checkTopics as each connection does: it fails for an
// offsets topic that would lose positions (ErrTopicConfig), and its
// warnings are the report's even without exactly-once delivery. An
// offsets topic whose settings the broker did not tell is not checked.
func (p *prober) offsetsTopic() (string, bool, error) {
	warnings, err := checkTopics(p.client, p.o)
	p.warnings = warnings
	if p.o.TransactionalID == "" {
		return notExactlyOnce, true, nil
	}
	if err != nil {
		return "", false, err
	}
	for _, w := range warnings {
		// checkTopics says so in its warnings, for all topics or for one.
		if strings.HasPrefix(w, "kafka topic settings not checked") ||
			strings.HasPrefix(w, "kafka topic "+p.o.OffsetsTopic+": ") && strings.Contains(w, "not checked") {
			return "not checked: " + w, true, nil
		}
	}
	return p.o.OffsetsTopic + " compacted", false, nil
}

// transactionalID finds the id's transaction coordinator, as the
// producer's transaction manager does before InitProducerId; Kafka
// refuses it with TRANSACTIONAL_ID_AUTHORIZATION_FAILED when the user may
// not describe the id.
func (p *prober) transactionalID() (string, bool, error) {
	id := p.o.TransactionalID
	if id == "" {
		return notExactlyOnce, true, nil
	}
	b, err := p.client.TransactionCoordinator(id)
	if errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) {
		return "", false, fmt.Errorf("no transaction coordinator for %s yet (%w): Kafka makes its __transaction_state topic at the first use of transactions, "+
			"and cannot while the brokers' transaction.state.log.replication.factor (default 3) or transaction.state.log.min.isr exceeds the number of brokers; "+
			"probe again, and check those settings if this persists", id, err)
	}
	if errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed) {
		return "", false, fmt.Errorf("transactional id %s refused (%w): allow %s Describe and Write on it "+
			"(kafka-acls.sh --bootstrap-server %s --add --allow-principal %s --operation Describe --operation Write --transactional-id %s), "+
			"or turn kafka.exactly_once off", id, err, p.principal(), p.o.Brokers[0], p.principal(), id)
	}
	if err != nil {
		return "", false, fmt.Errorf("find the transaction coordinator of %s: %w", id, err)
	}
	return fmt.Sprintf("coordinator of %s is broker %d at %s", id, b.ID(), b.Addr()), false, nil
}

// causes are several failures in one line, each kept for errors.Is.
type causes []error

func (c causes) Error() string {
	s := make([]string, len(c))
	for i, err := range c {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (c causes) Unwrap() []error { return c }

// explained is an error whose message says it all: it wraps the error it
// explains, for errors.Is, without repeating its text.
type explained struct {
	msg   string
	cause error
}

func (e explained) Error() string { return e.msg }
func (e explained) Unwrap() error { return e.cause }

// cutDialer dials for the probe's sarama client; cut closes every
// connection it made, when the probe's ctx ends (sarama's requests take no
// context, and a closed connection fails them at once) and when the probe
// does. Its own context ends the dials under way.
type cutDialer struct {
	ctx context.Context
	d   net.Dialer

	mu    sync.Mutex
	done  bool
	conns []net.Conn
}

func (c *cutDialer) Dial(network, addr string) (net.Conn, error) {
	conn, err := c.d.DialContext(c.ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		conn.Close()
		return nil, net.ErrClosed
	}
	c.conns = append(c.conns, conn)
	return conn, nil
}

func (c *cutDialer) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}
