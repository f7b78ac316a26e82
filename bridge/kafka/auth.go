package kafka

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/IBM/sarama"
)

// SASL is the authentication to the brokers. Password is a secret: it is
// never logged or put in an error.
type SASL struct {
	Mechanism string // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	User      string
	Password  string
}

// String keeps the password out of logs.
func (s SASL) String() string { return fmt.Sprintf("SASL %s as %q", s.Mechanism, s.User) }

// applySecurity sets TLS and SASL on a sarama configuration.
func applySecurity(c *sarama.Config, o Options) {
	if o.TLS != nil {
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = o.TLS
	}
	if o.SASL == nil {
		return
	}
	c.Net.SASL.Enable = true
	c.Net.SASL.Handshake = true
	c.Net.SASL.User = o.SASL.User
	c.Net.SASL.Password = o.SASL.Password
	switch o.SASL.Mechanism {
	case "SCRAM-SHA-256":
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return newSCRAM(scramSHA256) }
	case "SCRAM-SHA-512":
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return newSCRAM(scramSHA512) }
	default:
		c.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	}
}

// explainError turns what sarama reports when no broker would talk
// into what to check. Some brokers (and kfake) answer a failed SASL
// authentication by closing the connection, which sarama reports as EOF.
func explainError(err error, o Options) error {
	if !errors.Is(err, sarama.ErrOutOfBrokers) {
		if errors.Is(err, sarama.ErrSASLAuthenticationFailed) {
			return fmt.Errorf("kafka authentication failed (%v): check kafka.sasl.username and the password: %w", o.SASL, err)
		}
		return err
	}
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
	var authErr bool
	if errors.Is(err, sarama.ErrSASLAuthenticationFailed) {
		authErr = true
	}
	switch {
	case o.SASL != nil && (closed || authErr):
		return fmt.Errorf("no Kafka broker accepted the connection: authentication failed? (%v; check kafka.sasl.username and the password, and that the brokers offer %s): %w",
			o.SASL, o.SASL.Mechanism, err)
	case o.TLS == nil && closed:
		return fmt.Errorf("no Kafka broker accepted the connection: do the brokers want TLS (kafka.tls.enabled) or SASL (kafka.sasl)? %w", err)
	case o.TLS != nil:
		return fmt.Errorf("no Kafka broker reachable over TLS (check kafka.tls.ca_file and the brokers' certificates): %w", err)
	}
	return fmt.Errorf("no Kafka broker reachable (%w)", err)
}
