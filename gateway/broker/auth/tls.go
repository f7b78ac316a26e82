package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
)

// TLSFiles are the files of a TLS listener: its certificate and key and,
// if set, the CAs that verify client certificates.
type TLSFiles struct {
	CertFile, KeyFile string
	ClientCAFile      string
	RequireClientCert bool
}

// ClientIDSeparator ends the identity at the start of a client id
// ("dev-01:ota"): neither a username nor a certificate name may contain
// it, so the owner of a client id is never ambiguous.
const ClientIDSeparator = ":"

// ServerTLS holds the TLS configuration of the broker's listeners. Reload
// reads the files again (on SIGHUP): connections made afterwards use the
// new certificate and client CAs, open ones keep theirs.
type ServerTLS struct {
	files TLSFiles
	cur   atomic.Pointer[tls.Config]
}

func NewServerTLS(files TLSFiles) (*ServerTLS, error) {
	s := &ServerTLS{files: files}
	return s, s.Reload()
}

// Reload reads the certificate, key and client CA files.
func (s *ServerTLS) Reload() error {
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return fmt.Errorf("mqtt.tls: load certificate %s and key %s: %w", s.files.CertFile, s.files.KeyFile, err)
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// TLS 1.2 suites with forward secrecy and AEAD only; TLS 1.3's
		// suites are all of that and not configurable.
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
	}
	if s.files.ClientCAFile != "" {
		pem, err := os.ReadFile(s.files.ClientCAFile)
		if err != nil {
			return fmt.Errorf("mqtt.tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("mqtt.tls.client_ca_file %s: no PEM certificate in it", s.files.ClientCAFile)
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.VerifyClientCertIfGiven
		if s.files.RequireClientCert {
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	s.cur.Store(c)
	return nil
}

// Config returns the configuration to give a listener: it defers to the
// latest loaded one for each handshake.
func (s *ServerTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load(), nil
		},
	}
}

// CertIdentity returns the identity a verified client certificate gives a
// connection: its subject common name, or failing that its first DNS name.
func CertIdentity(c net.Conn) (string, bool, error) {
	for { // through the broker's wrappers (write deadline, WebSocket) to the TLS connection
		if _, ok := c.(*tls.Conn); ok {
			break
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return "", false, nil
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return "", false, nil
	}
	leaf := st.PeerCertificates[0]
	id := leaf.Subject.CommonName
	if id == "" && len(leaf.DNSNames) > 0 {
		id = leaf.DNSNames[0]
	}
	if !IdentityLevel(id) || strings.Contains(id, ClientIDSeparator) {
		// ':' ends the identity in a client id (ClientIDPrefixed), and
		// no username has one either.
		return "", true, errors.New("client certificate has no usable identity: its common name (or first DNS name) must be non-empty and free of '/', '+', '#' and ':'")
	}
	return id, true, nil
}
