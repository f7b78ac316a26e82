package gateway

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"
)

// hook connects the gateway to mochi: it authenticates clients and takes
// readings from publications.
type hook struct {
	mqtt.HookBase
	g     *Gateway
	auth  *authenticator
	acl   *acl
	conns *connLimiter

	clients sync.Map // *mqtt.Client → *clientInfo, while connected
}

// clientInfo is what the hook knows of a connected client.
type clientInfo struct {
	identity string
	role     *aclRole
	// publish is the client's publish rate bucket. Only the client's own
	// read goroutine (OnPublish) touches it.
	publish tokenBucket
	// subscribing holds the filters of the SUBSCRIBE being processed:
	// mochi asks OnACLCheck(read) both for them and for every message it
	// delivers to the client, with nothing else to tell the two apart.
	subscribing atomic.Pointer[[]string]
}

func (h *hook) ID() string { return "edgegate" }

func (h *hook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish, mqtt.OnSubscribe,
		mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.StoredClients,
		mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.StoredInflightMessages,
		mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.StoredSubscriptions}, []byte{b})
}

// OnConnect runs once a CONNECT is read and valid, before the
// credentials are checked (so a flood does not cost a bcrypt each). It
// refuses a source address that connects too often and sets the MQTT 5
// server keep alive.
func (h *hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	g := h.g
	if !h.conns.allow(cl.Net.Remote, g.now()) {
		g.mqttRefused[RefusedConnectRate].Add(1)
		if ok, held := g.logLimiter.allow("connect-rate", g.now()); ok {
			g.log.Warn("mqtt connection refused: too many connections from one address (mqtt.connect_rate_per_address)",
				"remote", cl.Net.Remote, "client", cl.ID, "suppressed_since_last", held)
		}
		code := packets.ErrConnectionRateExceeded
		if cl.Properties.ProtocolVersion < 5 {
			code = packets.Err3ServerUnavailable // 3.1.1 has no rate code
		}
		_ = g.server.SendConnack(cl, code, false, nil)
		return packets.ErrConnectionRateExceeded
	}
	// A client that asks for no keep alive, or a longer one, would hold
	// its socket for that long after its network vanished. MQTT 5 lets
	// the server say so; a 3.1.1 client is held to what it asked.
	if max := uint16(g.cfg.MQTT.MaxKeepAlive.D().Seconds()); cl.Properties.ProtocolVersion == 5 && (cl.State.Keepalive == 0 || cl.State.Keepalive > max) {
		cl.State.Keepalive = max
		cl.State.ServerKeepalive = true
	}
	return nil
}

// OnConnectAuthenticate establishes a client's identity: the common name
// of a verified client certificate, else the username of valid
// credentials, else (if anonymous clients are allowed) the client id.
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	g := h.g
	user := string(pk.Connect.Username)
	refuse := func(why string) bool {
		g.mqttRefused[RefusedCredentials].Add(1)
		if ok, held := g.logLimiter.allow("auth", g.now()); ok {
			g.log.Info("mqtt client refused: "+why, "client", cl.ID, "username", user, "remote", cl.Net.Remote, "suppressed_since_last", held)
		}
		return false
	}
	var info *clientInfo
	id, hasCert, err := certIdentity(cl.Net.Conn)
	switch {
	case err != nil:
		return refuse(err.Error())
	case hasCert:
		// The certificate is the credential. A username, if sent, must
		// name the same device.
		if user != "" && user != id {
			return refuse(fmt.Sprintf("username differs from the client certificate's identity %q", id))
		}
		info = &clientInfo{identity: id, role: h.acl.role(id)}
		cl.Properties.Username = []byte(id)
	case user == "" && len(pk.Connect.Password) == 0:
		if !h.auth.anonymous {
			return refuse("no credentials, and mqtt.allow_anonymous is false")
		}
		info = &clientInfo{identity: cl.ID, role: h.acl.anonymous}
	default:
		if !h.auth.check(user, pk.Connect.Password) {
			return refuse("bad username or password")
		}
		info = &clientInfo{identity: user, role: h.acl.role(user)}
	}
	h.clients.Store(cl, info)
	return true
}

// OnACLCheck applies the client's role. It runs for each PUBLISH (mochi
// answers a refused one with PUBACK/PUBREC 0x87 to MQTT 5 clients, drops
// it at QoS 0, and disconnects a 3.1.1 client) and for each filter of a
// SUBSCRIBE (SUBACK 0x87).
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	v, ok := h.clients.Load(cl)
	if !ok {
		// Not connected: a persistent session whose client is away (or
		// was restored at start). Messages for it are queued: its
		// subscriptions were checked when they were made. Nothing
		// unconnected publishes.
		return !write
	}
	info := v.(*clientInfo)
	g := h.g
	if write {
		if info.role.canPublish(topic, info.identity, cl.ID) {
			return true
		}
		g.mqttRefused[RefusedPublish].Add(1)
		if ok, held := g.logLimiter.allow("acl-pub", g.now()); ok {
			g.log.Warn("mqtt publish refused by ACL", "client", cl.ID, "identity", info.identity, "role", info.role.name,
				"topic", topic, "suppressed_since_last", held)
		}
		return false
	}
	if sub := info.subscribing.Load(); sub == nil || !slices.Contains(*sub, topic) {
		// A message on its way to the client: its subscription was
		// checked when it was made. Checked again here (without
		// allocating) in case the configuration changed since, as
		// restored sessions keep their subscriptions; not a refusal.
		return info.role.canRead(topic, info.identity, cl.ID)
	}
	if !info.role.canSubscribe(topic, info.identity, cl.ID) {
		g.mqttRefused[RefusedSubscribe].Add(1)
		if ok, held := g.logLimiter.allow("acl-sub", g.now()); ok {
			g.log.Warn("mqtt subscribe refused by ACL", "client", cl.ID, "identity", info.identity, "role", info.role.name,
				"filter", topic, "suppressed_since_last", held)
		}
		return false
	}
	if _, again := cl.State.Subscriptions.Get(topic); !again && cl.State.Subscriptions.Len() >= g.cfg.MQTT.MaxSubscriptions {
		g.mqttRefused[RefusedSubscriptionLimit].Add(1)
		return false
	}
	return true
}

// throttle holds a client's publication until its publish rate allows it.
// The client's packets are not read meanwhile, so TCP flow control slows
// it down; nothing is refused or lost.
func (h *hook) throttle(cl *mqtt.Client) {
	rate := h.g.cfg.MQTT.PublishRate
	if rate <= 0 {
		return
	}
	v, ok := h.clients.Load(cl)
	if !ok {
		return
	}
	info := v.(*clientInfo)
	burst := max(1, int(rate))
	if wait := info.publish.take(time.Now(), rate, burst); wait > 0 {
		h.g.throttled.Add(1)
		time.Sleep(wait)
		info.publish.take(time.Now(), rate, burst)
	}
}

// forgetConn cleans up after a connection whose goroutine panicked: mochi
// did not get to remove its client.
func (h *hook) forgetConn(c net.Conn) {
	for _, cl := range h.g.server.Clients.GetAll() {
		if cl.Net.Conn != c {
			continue
		}
		expire := !persistent(cl)
		h.OnDisconnect(cl, errors.New("decoder panic"), expire)
		if expire {
			h.g.server.UnsubscribeClient(cl)
			h.g.server.Clients.Delete(cl.ID)
		}
	}
}

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
	h.throttle(cl)
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
	h.clients.Delete(cl)
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

// OnSubscribe marks the filters of a SUBSCRIBE for OnACLCheck.
func (h *hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if v, ok := h.clients.Load(cl); ok {
		filters := make([]string, len(pk.Filters))
		for i, f := range pk.Filters {
			filters[i] = f.Filter
		}
		v.(*clientInfo).subscribing.Store(&filters)
	}
	return pk
}

// OnSubscribed journals the subscriptions granted, so that a persistent
// session has them again after a restart.
func (h *hook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if v, ok := h.clients.Load(cl); ok {
		v.(*clientInfo).subscribing.Store(nil)
	}
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
		if !identityLevel(name) {
			return nil, fmt.Errorf("%s:%d: user %q: a username may not contain '/', '+' or '#' (it stands for a topic level in ACLs)", path, n, name)
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
	anonymous bool

	mu       sync.Mutex
	users    Users
	verified map[string][sha256.Size]byte
}

// setUsers replaces the users (the file was reloaded).
func (a *authenticator) setUsers(u Users) {
	a.mu.Lock()
	a.users, a.verified = u, map[string][sha256.Size]byte{}
	a.mu.Unlock()
}

func newAuthenticator(users Users, anonymous bool) *authenticator {
	return &authenticator{users: users, anonymous: anonymous, verified: map[string][sha256.Size]byte{}}
}

// check verifies credentials; anonymous clients are decided by the hook
// before it gets here.
func (a *authenticator) check(user string, password []byte) bool {
	sum := sha256.Sum256(password)
	a.mu.Lock()
	hash, ok := a.users[user]
	cached, hit := a.verified[user]
	a.mu.Unlock()
	if !ok {
		return false // credentials were given, and they are wrong
	}
	if hit && subtle.ConstantTimeCompare(cached[:], sum[:]) == 1 {
		return true
	}
	if bcrypt.CompareHashAndPassword(hash, password) != nil {
		return false
	}
	a.mu.Lock()
	if string(a.users[user]) == string(hash) { // not replaced meanwhile
		a.verified[user] = sum
	}
	a.mu.Unlock()
	return true
}
