package kafka_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/configs/testpki"
)

// secureCluster starts kfake with SASL users (mechanism → password of
// user "gw") and, if ca is set, TLS.
func secureCluster(t *testing.T, ca *testpki.CA, users map[string]string) []string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	if len(users) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for mech, pw := range users {
			opts = append(opts, kfake.Superuser(mech, "gw", pw))
		}
	}
	if ca != nil {
		_, _, pair := ca.Issue("kafka", true)
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kafkatest.CreateTopics(t, c, 2, summaries, dead, "edge.offsets")
	return c.ListenAddrs()
}

// TestKafkaAuth delivers summaries through SASL SCRAM-SHA-256 and -512
// and PLAIN, with and without TLS, exactly-once and not, and reads them
// back with the same credentials.
func TestKafkaAuth(t *testing.T) {
	ca := testpki.New(t, "kafka-ca")
	for _, tc := range []struct {
		mech string
		tls  bool
		txn  bool
	}{
		{"SCRAM-SHA-256", false, false},
		{"SCRAM-SHA-512", false, true},
		{"SCRAM-SHA-512", true, true},
		{"PLAIN", true, false},
		{"", true, true}, // TLS alone
	} {
		t.Run(fmt.Sprintf("%s tls=%v exactly-once=%v", tc.mech, tc.tls, tc.txn), func(t *testing.T) {
			users := map[string]string{}
			o := kafka.Options{ClientID: "auth-test"}
			if tc.mech != "" {
				users[tc.mech] = "s3cret-" + tc.mech
				o.SASL = &kafka.SASL{Mechanism: tc.mech, User: "gw", Password: users[tc.mech]}
			}
			var pki *testpki.CA
			if tc.tls {
				pki = ca
				o.TLS = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
			}
			o.Brokers = secureCluster(t, pki, users)
			if tc.txn {
				o.TransactionalID, o.OffsetsTopic, o.PositionKey = "edgegate-gw-1", "edge.offsets", "gw-1"
			}
			f, err := bridge.NewForwarder(bridge.Options{Dir: t.TempDir(), Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead,
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, kafka.NewConnector(o))
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, f)
			sent := map[string]bool{}
			for m := range 5 {
				s := summary("dev-a", m)
				sent[s.ID] = true
				f.Summary(s, bridge.Mark{})
			}
			cfg := kafka.SaramaConfig(o)
			msgs, err := kafkatest.ConsumeWith(cfg, o.Brokers, summaries, 5, 15*time.Second)
			if err := stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			if err != nil {
				t.Fatalf("consume: %v (got %d)", err, len(msgs))
			}
			for _, m := range msgs {
				var s aggregate.Summary
				if err := json.Unmarshal(m.Value, &s); err != nil || !sent[s.ID] {
					t.Fatalf("unexpected record %s (%v)", m.Value, err)
				}
				delete(sent, s.ID)
			}
			if len(sent) != 0 || len(msgs) != 5 {
				t.Errorf("read %d records; missing %v", len(msgs), sent)
			}
		})
	}
}

// TestKafkaAuthErrors: what a user sees when the credentials or the TLS
// settings are wrong. kfake, like some brokers, answers a bad password by
// closing the connection; the error must say authentication failed, not
// EOF, and never show the password.
func TestKafkaAuthErrors(t *testing.T) {
	ca := testpki.New(t, "kafka-ca")
	sasl := secureCluster(t, nil, map[string]string{"SCRAM-SHA-512": "right-password"})
	withTLS := secureCluster(t, ca, nil)
	connect := func(o kafka.Options) error {
		o.ClientID = "auth-errors"
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		p, err := kafka.NewConnector(o)(ctx)
		if err == nil {
			p.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name string
		o    kafka.Options
		want string
	}{
		{"wrong password", kafka.Options{Brokers: sasl, SASL: &kafka.SASL{Mechanism: "SCRAM-SHA-512", User: "gw", Password: "wrong-password"}},
			"authentication failed? (SASL SCRAM-SHA-512 as \"gw\""},
		{"unknown user", kafka.Options{Brokers: sasl, SASL: &kafka.SASL{Mechanism: "SCRAM-SHA-512", User: "nobody", Password: "wrong-password"}},
			"authentication failed?"},
		{"wrong mechanism", kafka.Options{Brokers: sasl, SASL: &kafka.SASL{Mechanism: "SCRAM-SHA-256", User: "gw", Password: "right-password"}},
			"authentication failed?"},
		{"no SASL", kafka.Options{Brokers: sasl}, "do the brokers want TLS (kafka.tls.enabled) or SASL (kafka.sasl)?"},
		{"TLS with an unknown CA", kafka.Options{Brokers: withTLS, TLS: &tls.Config{RootCAs: testpki.New(t, "other").Pool()}},
			"no Kafka broker reachable over TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := connect(tc.o)
			if err == nil {
				t.Fatal("connected")
			}
			t.Logf("%v", err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "password") && strings.Contains(err.Error(), "wrong-password") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}
