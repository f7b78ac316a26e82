package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSFiles names the files of a TLS connection to the brokers.
type TLSFiles struct {
	// CAFile verifies the brokers; empty uses the system's CAs.
	CAFile string
	// CertFile and KeyFile are the client certificate (mutual TLS), if the
	// brokers want one; both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name checked in the brokers' certificates.
	ServerName string
}

// NewTLSConfig reads the files and returns the TLS configuration for
// Options.TLS (TLS 1.2 at least). Errors name the kafka.tls configuration
// key of the file that is wrong.
func NewTLSConfig(f TLSFiles) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.tls.ca_file %s: no PEM certificate in it", f.CAFile)
		}
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls: load client certificate %s and key %s: %w", f.CertFile, f.KeyFile, err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
