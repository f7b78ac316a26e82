package kafka

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// scramClient is the client side of SCRAM (RFC 5802) with SHA-256 or
// SHA-512 (RFC 7677), as sarama's SCRAMClient. Names and passwords are
// used as their UTF-8 bytes, without SASLprep normalization, as Kafka's
// brokers do (a SASLprep library's tables cost a quarter of a megabyte of
// the ARM binary).
type scramClient struct {
	hash func() hash.Hash

	step                    int
	user, password, authzID string
	nonce, clientFirstBare  string
	serverSignature         []byte
	done                    bool
}

func newSCRAM(h func() hash.Hash) *scramClient { return &scramClient{hash: h} }

var (
	scramSHA256 = sha256.New
	scramSHA512 = sha512.New
)

func (s *scramClient) Begin(user, password, authzID string) error {
	var r [24]byte
	if _, err := rand.Read(r[:]); err != nil {
		return fmt.Errorf("scram: nonce: %w", err)
	}
	*s = scramClient{hash: s.hash, user: user, password: password, authzID: authzID, nonce: base64.RawStdEncoding.EncodeToString(r[:])}
	return nil
}

func (s *scramClient) gs2Header() string {
	if s.authzID == "" {
		return "n,,"
	}
	return "n,a=" + saslName(s.authzID) + ","
}

// saslName escapes '=' and ',' in a name (RFC 5802 5.1).
func saslName(n string) string {
	return strings.NewReplacer("=", "=3D", ",", "=2C").Replace(n)
}

func (s *scramClient) Step(challenge string) (string, error) {
	s.step++
	switch s.step {
	case 1:
		s.clientFirstBare = "n=" + saslName(s.user) + ",r=" + s.nonce
		return s.gs2Header() + s.clientFirstBare, nil
	case 2:
		return s.clientFinal(challenge)
	case 3:
		s.done = true
		return "", s.verify(challenge)
	}
	return "", errors.New("scram: conversation already over")
}

func (s *scramClient) Done() bool { return s.done }

// attrs parses a message's comma-separated k=v attributes.
func attrs(msg string) map[byte]string {
	m := map[byte]string{}
	for _, kv := range strings.Split(msg, ",") {
		if len(kv) >= 2 && kv[1] == '=' {
			m[kv[0]] = kv[2:]
		}
	}
	return m
}

func (s *scramClient) clientFinal(serverFirst string) (string, error) {
	a := attrs(serverFirst)
	if e, ok := a['e']; ok {
		return "", fmt.Errorf("scram: server error: %s", e)
	}
	nonce, salt64, iter := a['r'], a['s'], a['i']
	if !strings.HasPrefix(nonce, s.nonce) || len(nonce) == len(s.nonce) {
		return "", errors.New("scram: the server's nonce does not extend ours")
	}
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil || len(salt) == 0 {
		return "", errors.New("scram: bad salt from the server")
	}
	n, err := strconv.Atoi(iter)
	if err != nil || n < 1 {
		return "", fmt.Errorf("scram: bad iteration count %q from the server", iter)
	}
	salted, err := pbkdf2.Key(s.hash, s.password, salt, n, s.hash().Size())
	if err != nil {
		return "", fmt.Errorf("scram: %w", err)
	}
	clientKey := s.mac(salted, "Client Key")
	h := s.hash()
	h.Write(clientKey)
	storedKey := h.Sum(nil)
	withoutProof := "c=" + base64.StdEncoding.EncodeToString([]byte(s.gs2Header())) + ",r=" + nonce
	authMessage := s.clientFirstBare + "," + serverFirst + "," + withoutProof
	proof := s.mac(storedKey, authMessage)
	for i := range proof {
		proof[i] ^= clientKey[i]
	}
	s.serverSignature = s.mac(s.mac(salted, "Server Key"), authMessage)
	return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

func (s *scramClient) verify(serverFinal string) error {
	a := attrs(serverFinal)
	if e, ok := a['e']; ok {
		return fmt.Errorf("scram: server error: %s", e)
	}
	v, err := base64.StdEncoding.DecodeString(a['v'])
	if err != nil || subtle.ConstantTimeCompare(v, s.serverSignature) != 1 {
		return errors.New("scram: the server's signature is wrong (is it the broker it claims to be?)")
	}
	return nil
}

func (s *scramClient) mac(key []byte, msg string) []byte {
	m := hmac.New(s.hash, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
