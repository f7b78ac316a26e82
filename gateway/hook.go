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
	"github.com/mochi-mqtt/server/v2/hooks/storage"
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
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish,
		mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.StoredClients,
		mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.StoredInflightMessages,
		mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.StoredSubscriptions}, []byte{b})
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

// OnPublish runs in the publisher's goroutine before mochi acknowledges.
// A publication on a reading topic is journaled; QoS 1/2 ones are
// acknowledged only once the journal has them on disk:
//
//   - QoS 1, not retained, with no subscriber anywhere (the usual case for
//     a gateway): mochi is handed the packet back as an ignored QoS 0 one,
//     so it neither acknowledges nor routes it, and the journal writes the
//     PUBACK once the group fsync is done; the client's next publications
//     are read meanwhile and share the fsync;
//   - otherwise (QoS 2, retained, or subscribers to route to) the hook
//     waits for the fsync and mochi acknowledges and routes as usual.
//
// QoS 0 publications are journaled without waiting. When no client is
// subscribed to anything, a publication that is not to be retained has
// nowhere to go; saying so (CodeSuccessIgnore) spares mochi its subscriber
// lookup, which allocates several maps per message.
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	g := h.g
	qos := pk.FixedHeader.Qos
	noSubscribers := atomic.LoadInt64(&g.server.Info.Subscriptions) == 0
	if !g.readingTopic(pk.TopicName) {
		if !pk.FixedHeader.Retain && noSubscribers {
			return pk, packets.CodeSuccessIgnore
		}
		return pk, nil
	}
	if qos > 0 && g.out.Full() {
		// Storage quota reached under the backpressure policy: do not take
		// responsibility for the reading. MQTT 5 clients get PUBACK 0x97
		// (quota exceeded); 3.1.1 clients get no acknowledgement and resend
		// later.
		g.refused.Add(1)
		if ok, held := g.logLimiter.allow("quota", g.now()); ok {
			g.log.Warn("storage quota reached: refusing QoS 1/2 readings", "client", cl.ID, "suppressed_since_last", held)
		}
		if cl.Properties.ProtocolVersion == 5 {
			return pk, packets.ErrQuotaExceeded
		}
		return pk, packets.ErrRejectPacket
	}
	flags := qos & flagQoSMask
	if pk.FixedHeader.Dup {
		flags |= flagDup
	}
	if pk.FixedHeader.Retain {
		flags |= flagRetain
	}
	async := qos == 1 && !pk.FixedHeader.Retain && noSubscribers
	b, err := g.j.publish(cl, flags, pk.PacketID, pk.TopicName, pk.Payload, async)
	if err == nil && qos > 0 && !async {
		err = b.wait()
	}
	if err != nil {
		// The journal failed or is closing: never acknowledge. The client
		// keeps the publication and sends it again.
		return pk, packets.ErrRejectPacket
	}
	if async {
		// The journal sends the PUBACK. Handed back as an ignored QoS 0
		// publication, the packet is neither acknowledged nor routed by
		// mochi. (ErrRejectPacket would do the same, but mochi then boxes
		// the whole packet for a debug log line: 800 bytes of garbage per
		// reading.)
		pk.FixedHeader.Qos = 0
		pk.Ignore = true
		return pk, nil
	}
	if !pk.FixedHeader.Retain && noSubscribers {
		return pk, packets.CodeSuccessIgnore
	}
	return pk, nil
}

// persistent reports whether cl's session outlives its connection.
func persistent(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval > 0
	}
	return !cl.Properties.Clean
}

// OnSessionEstablished journals a persistent session, so that after a
// restart mochi has it again (CONNACK says session present and the client
// resends what was not acknowledged). A clean start ends the journaled
// session, and with it the client's duplicate detection.
func (h *hook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline {
		return
	}
	if pk.Connect.Clean || !persistent(cl) {
		h.g.j.sessionEnd(cl.ID)
	}
	if persistent(cl) {
		h.g.j.sessionStart(cl.ID, session{proto: cl.Properties.ProtocolVersion, expiry: cl.Properties.Props.SessionExpiryInterval,
			username: string(cl.Properties.Username), listener: cl.Net.Listener})
	}
}

// OnDisconnect journals the end of a session that expires with its
// connection.
func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if expire && !cl.Net.Inline {
		h.g.j.sessionEnd(cl.ID)
	}
}

// OnClientExpired journals the end of a session that outlived its
// connection and has now expired.
func (h *hook) OnClientExpired(cl *mqtt.Client) { h.g.j.sessionEnd(cl.ID) }

// OnQosComplete journals the end of a QoS 2 exchange a client began (its
// PUBREL was answered). Completions of the broker's own deliveries are
// not state.
func (h *hook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Pubrel && !cl.Net.Inline {
		h.g.j.pubrel(cl.ID, pk.PacketID)
	}
}

// OnQosDropped: a PUBREL with an error reason ends the exchange too.
func (h *hook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Pubrel && !cl.Net.Inline {
		h.g.j.pubrel(cl.ID, pk.PacketID)
	}
}

// StoredInflightMessages gives mochi, as it starts, the QoS 2 exchanges
// awaiting PUBREL, as in-flight PUBRECs: it resends them when the client
// resumes its session, and answers its PUBREL with PUBCOMP.
func (h *hook) StoredInflightMessages() ([]storage.Message, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	var v []storage.Message
	for id, pids := range h.g.awaitRel {
		for pid := range pids {
			v = append(v, storage.Message{T: storage.InflightKey, ID: fmt.Sprintf("if_%s_%d", id, pid), Client: id, Origin: id,
				PacketID: pid, FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, Created: h.g.now().Unix()})
		}
	}
	return v, nil
}

// OnSubscribed journals the subscriptions granted, so that a persistent
// session has them again after a restart.
func (h *hook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if cl.Net.Inline {
		return
	}
	for i, f := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		h.g.j.subscribe(cl.ID, f.Filter, subscription{qos: f.Qos, retainHandling: f.RetainHandling, noLocal: f.NoLocal,
			retainAsPublish: f.RetainAsPublished, identifier: f.Identifier})
	}
}

// OnUnsubscribed journals the end of subscriptions. When a session is
// taken over, mochi unsubscribes the old connection after the new one has
// inherited its subscriptions: that is not an end.
func (h *hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline || cl.IsTakenOver() {
		return
	}
	for _, f := range pk.Filters {
		h.g.j.unsubscribe(cl.ID, f.Filter)
	}
}

// StoredSubscriptions gives mochi, as it starts, the subscriptions of the
// persistent sessions.
func (h *hook) StoredSubscriptions() ([]storage.Subscription, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	var v []storage.Subscription
	for id, subs := range h.g.subs {
		if _, ok := h.g.sessions[id]; !ok {
			continue
		}
		for f, s := range subs {
			v = append(v, storage.Subscription{T: storage.SubscriptionKey, ID: id + ":" + f, Client: id, Filter: f, Qos: s.qos,
				RetainHandling: s.retainHandling, NoLocal: s.noLocal, RetainAsPublished: s.retainAsPublish, Identifier: s.identifier})
		}
	}
	// mochi does not count the subscriptions it loads, and OnPublish
	// routes publications only when the count is non-zero: count them
	// here, before the listeners accept anyone.
	atomic.AddInt64(&h.g.server.Info.Subscriptions, int64(len(v)))
	return v, nil
}

// StoredClients gives mochi, as it starts, the persistent sessions the
// journal holds.
func (h *hook) StoredClients() ([]storage.Client, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	v := make([]storage.Client, 0, len(h.g.sessions))
	for id, s := range h.g.sessions {
		v = append(v, storage.Client{ID: id, T: storage.ClientKey, ProtocolVersion: s.proto, Username: []byte(s.username),
			Listener: s.listener, Properties: storage.ClientProperties{SessionExpiryInterval: s.expiry, SessionExpiryIntervalFlag: s.proto == 5}})
	}
	return v, nil
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
