package gateway

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"
)

// hook connects the gateway to mochi: it authenticates clients and takes
// readings from publications.
type hook struct {
	mqtt.HookBase
	g    *Gateway
	auth *authenticator
}

func (h *hook) ID() string { return "edgegate" }

func (h *hook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish}, []byte{b})
}

func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	ok := h.auth.check(string(pk.Connect.Username), pk.Connect.Password)
	if !ok {
		h.g.log.Info("mqtt client refused: bad or missing credentials", "client", cl.ID, "username", string(pk.Connect.Username), "remote", cl.Net.Remote)
	}
	return ok
}

// OnACLCheck allows every topic to authenticated clients. Per-device topic
// ACLs come with the security work; until then any authenticated client may
// publish under any device.
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool { return true }

// OnPublish runs in the publisher's goroutine before the acknowledgement.
//
// When no client is subscribed to anything, a publication that is not to be
// retained has nowhere to go; saying so (CodeSuccessIgnore) spares mochi its
// subscriber lookup, which allocates several maps per message, without
// changing the acknowledgement.
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	if pk.FixedHeader.Qos > 0 && h.g.out.Full() {
		// Storage quota reached under the backpressure policy: do not take
		// responsibility for the reading. MQTT 5 clients get PUBACK 0x97
		// (quota exceeded); 3.1.1 clients get no acknowledgement and resend
		// later.
		h.g.refused.Add(1)
		if ok, held := h.g.logLimiter.allow("quota", h.g.now()); ok {
			h.g.log.Warn("storage quota reached: refusing QoS 1/2 readings", "client", cl.ID, "suppressed_since_last", held)
		}
		if cl.Properties.ProtocolVersion == 5 {
			return pk, packets.ErrQuotaExceeded
		}
		return pk, packets.ErrRejectPacket
	}
	h.g.ingest(pk.TopicName, cl.ID, pk.Payload)
	if !pk.FixedHeader.Retain && atomic.LoadInt64(&h.g.server.Info.Subscriptions) == 0 {
		return pk, packets.CodeSuccessIgnore
	}
	return pk, nil
}

// Users maps usernames to bcrypt password hashes.
type Users map[string][]byte

// LoadUsers reads a users file: one "username:bcrypt-hash" per line, as
// `htpasswd -B` writes; blank lines and lines starting with # are ignored.
func LoadUsers(path string) (Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open users file: %w", err)
	}
	defer f.Close()
	users := Users{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s:%d: want username:bcrypt-hash", path, n)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("%s:%d: user %q: not a bcrypt hash (%v); create it with htpasswd -B or edgegate passwd", path, n, name, err)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("%s:%d: user %q appears twice", path, n, name)
		}
		users[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read users file %s: %w", path, err)
	}
	return users, nil
}

// authenticator checks CONNECT credentials. A bcrypt comparison costs tens
// of milliseconds on a Pi; after one succeeds, a SHA-256 of the password is
// cached so that a reconnect storm of thousands of devices does not pin the
// CPU.
type authenticator struct {
	users     Users
	anonymous bool

	mu       sync.Mutex
	verified map[string][sha256.Size]byte
}

func newAuthenticator(users Users, anonymous bool) *authenticator {
	return &authenticator{users: users, anonymous: anonymous, verified: map[string][sha256.Size]byte{}}
}

func (a *authenticator) check(user string, password []byte) bool {
	if user == "" && len(password) == 0 {
		return a.anonymous
	}
	hash, ok := a.users[user]
	if !ok {
		return false // credentials were given, and they are wrong
	}
	sum := sha256.Sum256(password)
	a.mu.Lock()
	cached, hit := a.verified[user]
	a.mu.Unlock()
	if hit && subtle.ConstantTimeCompare(cached[:], sum[:]) == 1 {
		return true
	}
	if bcrypt.CompareHashAndPassword(hash, password) != nil {
		return false
	}
	a.mu.Lock()
	a.verified[user] = sum
	a.mu.Unlock()
	return true
}
