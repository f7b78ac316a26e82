package broker

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgegate/edgegate/gateway/broker/auth"
	"github.com/edgegate/edgegate/gateway/internal/ratelimit"
	"github.com/edgegate/edgegate/gateway/journal"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// hook connects the broker to mochi: it authenticates clients, applies
// the ACLs and limits, and journals publications on reading topics and the
// life of persistent sessions.
type hook struct {
	mqtt.HookBase
	b     *Broker
	auth  *auth.Authenticator
	acl   *auth.ACL
	conns *ratelimit.PerAddress

	clients  sync.Map // *mqtt.Client → *clientInfo, while connected
	subs     subCount
	sessions sessions // persistent sessions, by client id
}

// subCount mirrors the subscriptions mochi's topic index holds, by client
// id and filter, from the hook's own events, so that OnPublish can tell
// cheaply that nobody is subscribed. mochi's Info.Subscriptions cannot be
// trusted for that: its UNSUBSCRIBE counts a subscription removed whenever
// the filter's node exists in the index (another client's subscription, a
// retained message), whether or not the client had subscribed, so the
// count reaches 0 with subscribers left and their messages would not be
// routed. Here only what was added is removed.
type subCount struct {
	mu    sync.Mutex
	by    map[string]map[string]struct{} // client id → filters
	total atomic.Int64
}

// none reports that no client is subscribed to anything.
func (s *subCount) none() bool { return s.total.Load() == 0 }

func (s *subCount) add(client, filter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]map[string]struct{}{}
	}
	fs := s.by[client]
	if fs == nil {
		fs = map[string]struct{}{}
		s.by[client] = fs
	}
	if _, ok := fs[filter]; !ok {
		fs[filter] = struct{}{}
		s.total.Add(1)
	}
}

func (s *subCount) remove(client, filter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.by[client]
	if _, ok := fs[filter]; !ok {
		return
	}
	delete(fs, filter)
	if len(fs) == 0 {
		delete(s.by, client)
	}
	s.total.Add(-1)
}

// clientInfo is what the hook knows of a connected client.
type clientInfo struct {
	identity  string
	anonymous bool // identity is the client id
	role      *auth.Role
	// publish and publishBytes are the client's publish rate buckets, of
	// messages and of bytes. Only the client's own read goroutine
	// (OnPublish) touches them.
	publish, publishBytes ratelimit.Bucket
	// pings is the client's PINGREQ budget (mqtt.ping_rate_per_client);
	// only its read goroutine (OnPacketRead) touches it.
	pings ratelimit.Bucket
	// subscribing holds the filters of the SUBSCRIBE being processed:
	// mochi asks OnACLCheck(read) both for them and for every message it
	// delivers to the client, with nothing else to tell the two apart.
	subscribing atomic.Pointer[[]string]
	// acks writes the PUBACKs the journal sends the client; it is the
	// address the journal is given for them.
	acks ackWriter
}

func (i *clientInfo) owner() owner { return owner{name: i.identity, anonymous: i.anonymous} }

func (h *hook) ID() string { return "edgegate" }

func (h *hook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish, mqtt.OnSubscribe,
		mqtt.OnSessionEstablished, mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.StoredClients,
		mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.StoredInflightMessages, mqtt.OnPacketRead,
		mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.StoredSubscriptions, mqtt.OnWillSent}, []byte{b})
}

// OnConnect runs once a CONNECT is read and valid, before the
// credentials are checked (so a flood does not cost a bcrypt each). It
// refuses a source address that connects too often and sets the MQTT 5
// server keep alive.
func (h *hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	b := h.b
	if !h.conns.Allow(cl.Net.Remote, b.now()) {
		b.mqttRefused[RefusedConnectRate].Add(1)
		if ok, held := b.logLimiter.Allow("connect-rate", b.now()); ok {
			b.log.Warn("mqtt connection refused: too many connections from one address (mqtt.connect_rate_per_address)",
				"remote", cl.Net.Remote, "client", cl.ID, "suppressed_since_last", held)
		}
		code := packets.ErrConnectionRateExceeded
		if cl.Properties.ProtocolVersion < 5 {
			code = packets.Err3ServerUnavailable // 3.1.1 has no rate code
		}
		_ = b.server.SendConnack(cl, code, false, nil)
		return packets.ErrConnectionRateExceeded
	}
	// A client that asks for no keep alive, or a longer one, would hold
	// its socket, session and will for 1.5 times that after its network
	// vanished. MQTT 5 lets the server say so (mqtt.max_keep_alive, 2 min
	// by default: above the 60 s common clients ask for); a 3.1.1 client
	// is held to what it asked.
	if max := uint16(b.opts.MaxKeepAlive.Seconds()); cl.Properties.ProtocolVersion == 5 && (cl.State.Keepalive == 0 || cl.State.Keepalive > max) {
		cl.State.Keepalive = max
		cl.State.ServerKeepalive = true
	}
	return nil
}

// OnConnectAuthenticate establishes a client's identity: the common name
// of a verified client certificate, else the username of valid
// credentials, else (if anonymous clients are allowed) the client id.
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	b := h.b
	user := string(pk.Connect.Username)
	refuse := func(why string) bool {
		b.mqttRefused[RefusedCredentials].Add(1)
		if ok, held := b.logLimiter.Allow("auth", b.now()); ok {
			b.log.Info("mqtt client refused: "+why, "client", cl.ID, "username", user, "remote", cl.Net.Remote, "suppressed_since_last", held)
		}
		return false
	}
	var info *clientInfo
	id, hasCert, err := auth.CertIdentity(cl.Net.Conn)
	switch {
	case err != nil:
		return refuse(err.Error())
	case hasCert:
		// The certificate is the credential. A username, if sent, must
		// name the same device.
		if user != "" && user != id {
			return refuse(fmt.Sprintf("username differs from the client certificate's identity %q", id))
		}
		info = &clientInfo{identity: id, role: h.acl.CertRole(id)}
		cl.Properties.Username = []byte(id)
	case user == "" && len(pk.Connect.Password) == 0:
		if !h.auth.Anonymous {
			return refuse("no credentials, and mqtt.allow_anonymous is false")
		}
		info = &clientInfo{identity: cl.ID, anonymous: true, role: h.acl.Anonymous}
	default:
		ok, err := h.auth.Check(user, pk.Connect.Password)
		if errors.Is(err, auth.ErrBusy) {
			// Not checked: as many others are (mqtt.max_password_checks).
			// The client tries again later, as after max_clients.
			b.mqttRefused[RefusedAuthBusy].Add(1)
			if ok, held := b.logLimiter.Allow("auth-busy", b.now()); ok {
				b.log.Warn("mqtt client refused: too many password checks at once (mqtt.max_password_checks)", "client", cl.ID,
					"username", user, "remote", cl.Net.Remote, "suppressed_since_last", held)
			}
			code := packets.ErrServerBusy
			if cl.Properties.ProtocolVersion < 5 {
				code = packets.Err3ServerUnavailable
			}
			_ = b.server.SendConnack(cl, code, false, nil)
			// The CONNACK is sent: stop mochi sending its own (0x86).
			cl.Stop(fmt.Errorf("connection refused: %s", RefusedAuthBusy))
			return false
		}
		if !ok {
			return refuse("bad username or password")
		}
		info = &clientInfo{identity: user, role: h.acl.UserRole(user)}
	}
	if w := cl.Properties.Will; w.Flag != 0 && !info.role.CanPublish(w.TopicName, info.identity, cl.ID) {
		// mochi sends a will without asking the ACL: one on a topic the
		// client may not publish to (another device's, another Sparkplug
		// edge node's NDEATH) is dropped, and the connection kept.
		cl.Properties.Will = mqtt.Will{}
		b.mqttRefused[RefusedPublish].Add(1)
		if ok, held := b.logLimiter.Allow("acl-will", b.now()); ok {
			b.log.Warn("mqtt will dropped: its topic is not one the client may publish to", "client", cl.ID, "identity", info.identity,
				"role", info.role.Name, "topic", w.TopicName, "suppressed_since_last", held)
		}
	}
	if r, why, ok := h.admitSession(cl, info); !ok {
		b.mqttRefused[r].Add(1)
		if ok, held := b.logLimiter.Allow("session", b.now()); ok {
			b.log.Warn("mqtt client refused: "+why, "client", cl.ID, "identity", info.identity, "remote", cl.Net.Remote, "suppressed_since_last", held)
		}
		// The CONNACK is sent: stop mochi sending its own (0x86).
		cl.Stop(fmt.Errorf("connection refused: %s", r))
		return false
	}
	info.acks.cl, info.acks.b = cl, b
	info.acks.rc.margin = b.opts.ReceiptMargin
	if info.acks.rc.margin <= 0 {
		info.acks.rc.margin = DefaultReceiptMargin
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
		// subscriptions were checked when they were made, but one may
		// match denied topics ("#"), whose messages mochi would send
		// unchecked when the client returns. Nothing unconnected
		// publishes.
		return !write && !h.acl.DeniedAway(topic, string(cl.Properties.Username), cl.ID) && h.b.bounds.queued.room(h.b, cl)
	}
	info := v.(*clientInfo)
	b := h.b
	if write {
		if info.role.CanPublish(topic, info.identity, cl.ID) {
			return true
		}
		b.mqttRefused[RefusedPublish].Add(1)
		if ok, held := b.logLimiter.Allow("acl-pub", b.now()); ok {
			b.log.Warn("mqtt publish refused by ACL", "client", cl.ID, "identity", info.identity, "role", info.role.Name,
				"topic", topic, "suppressed_since_last", held)
		}
		return false
	}
	if sub := info.subscribing.Load(); sub == nil || !slices.Contains(*sub, topic) {
		// A message on its way to the client: its subscription was
		// checked when it was made. Checked again here (without
		// allocating) in case the configuration changed since, as
		// restored sessions keep their subscriptions; not a refusal.
		return info.role.CanRead(topic, info.identity, cl.ID) && h.b.bounds.queued.room(h.b, cl)
	}
	if !info.role.CanSubscribe(topic, info.identity, cl.ID) {
		b.mqttRefused[RefusedSubscribe].Add(1)
		if ok, held := b.logLimiter.Allow("acl-sub", b.now()); ok {
			b.log.Warn("mqtt subscribe refused by ACL", "client", cl.ID, "identity", info.identity, "role", info.role.Name,
				"filter", topic, "suppressed_since_last", held)
		}
		return false
	}
	if _, again := cl.State.Subscriptions.Get(topic); !again && cl.State.Subscriptions.Len() >= b.opts.MaxSubscriptions {
		b.mqttRefused[RefusedSubscriptionLimit].Add(1)
		return false
	}
	return true
}

// throttle holds a client's publication of size bytes (topic and payload)
// until its publish rates allow it: mqtt.publish_rate_per_client counts
// messages, and publish_bytes_rate_per_client their bytes, so that
// a client within the message rate cannot send max_packet_bytes with
// each. It sleeps in the client's own goroutine: the client's packets are
// not read meanwhile, so TCP flow control slows it down; nothing is
// refused or lost. A publication held by either rate counts once in
// Throttled.
func (h *hook) throttle(info *clientInfo, size int) {
	held := false
	if rate := h.b.opts.PublishRate; rate > 0 {
		burst := max(1, int(rate))
		if wait := info.publish.Take(time.Now(), rate, burst); wait > 0 {
			held = true
			time.Sleep(wait)
			info.publish.Take(time.Now(), rate, burst)
		}
	}
	if rate := h.b.opts.PublishBytesRate; rate > 0 {
		// A publication takes its bytes at once, into debt if need be
		// (one larger than what is left still goes), and is held until
		// the debt is paid; the client's next packet waits with it.
		if wait := info.publishBytes.TakeN(time.Now(), float64(size), rate, h.b.opts.PublishBytesBurst); wait > 0 {
			held = true
			time.Sleep(wait)
		}
	}
	if held {
		h.b.throttled.Add(1)
	}
}

// forgetConn cleans up after a connection whose goroutine panicked: mochi
// did not get to remove its client.
func (h *hook) forgetConn(c net.Conn) {
	for _, cl := range h.b.server.Clients.GetAll() {
		if cl.Net.Conn != c {
			continue
		}
		expire := !persistent(cl)
		h.OnDisconnect(cl, errors.New("decoder panic"), expire)
		if expire {
			h.b.server.UnsubscribeClient(cl)
			h.b.server.Clients.Delete(cl.ID)
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
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (_ packets.Packet, err error) {
	if cl.Net.Inline {
		return pk, nil
	}
	b := h.b
	v, ok := h.clients.Load(cl)
	if !ok {
		return pk, packets.ErrRejectPacket // not authenticated: cannot happen
	}
	info := v.(*clientInfo)
	h.throttle(info, len(pk.TopicName)+len(pk.Payload))
	qos := pk.FixedHeader.Qos
	if qos > 0 {
		if int(info.acks.open2.Load()) >= b.opts.ReceiveMaximum {
			// Its PUBRELs are behind this publication: waiting would wait
			// for good.
			return pk, h.overReceiveMaximum(cl)
		}
		ok, held, stalled := info.acks.admit(int32(b.opts.ReceiveMaximum), maxUnreceived(b.opts.ReceiveMaximum), b.opts.WriteTimeout)
		if held {
			b.flowHeld.Add(1)
		}
		if stalled {
			// It takes none of its PUBACKs: as a write to it that waited
			// mqtt.write_timeout.
			b.mqttRefused[RefusedWriteTimeout].Add(1)
			cl.Stop(fmt.Errorf("%w: its acknowledgements not taken for mqtt.write_timeout", os.ErrDeadlineExceeded))
		}
		if !ok {
			return pk, packets.ErrRejectPacket // the connection ended: the client resends
		}
	}
	if qos == 2 {
		defer func() {
			if err == nil || errors.Is(err, packets.CodeSuccessIgnore) {
				info.acks.open2.Add(1) // mochi sends PUBREC: in flight until the PUBREL
			}
		}()
	}
	noSubscribers := h.subs.none()
	if !b.in.ReadingTopic(pk.TopicName) {
		if !pk.FixedHeader.Retain && noSubscribers {
			return pk, packets.CodeSuccessIgnore
		}
		return pk, nil
	}
	if qos > 0 && b.in.Full() {
		// Storage quota reached under the backpressure policy: do not take
		// responsibility for the reading. MQTT 5 clients get PUBACK 0x97
		// (quota exceeded); 3.1.1 clients get no acknowledgement and resend
		// later.
		b.quota.Add(1)
		if ok, held := b.logLimiter.Allow("quota", b.now()); ok {
			b.log.Warn("storage quota reached: refusing QoS 1/2 readings", "client", cl.ID, "suppressed_since_last", held)
		}
		if cl.Properties.ProtocolVersion == 5 {
			return pk, packets.ErrQuotaExceeded
		}
		return pk, packets.ErrRejectPacket
	}
	flags := qos & journal.FlagQoSMask
	if pk.FixedHeader.Dup {
		flags |= journal.FlagDup
	}
	if pk.FixedHeader.Retain {
		flags |= journal.FlagRetain
	}
	async := qos == 1 && !pk.FixedHeader.Retain && noSubscribers
	if async {
		info.acks.promise()
	}
	batch, i, err := b.j.Publish(cl.ID, h.ownDevice(cl), &info.acks, flags, pk.PacketID, pk.TopicName, pk.Payload, async)
	if err == nil && qos > 0 && !async {
		err = batch.Wait()
		// mochi acknowledges this one: after the journal's PUBACKs of
		// the client's earlier publications.
		info.acks.waitWritten(b.opts.WriteTimeout)
	}
	if err != nil {
		if async {
			info.acks.broken()
		}
		// The journal failed or is closing: never acknowledge. The client
		// keeps the publication and sends it again.
		return pk, packets.ErrRejectPacket
	}
	if qos > 0 {
		// The seq of an async one is known only once its batch is
		// written; its PUBACK carries it (WriteAcks).
		var seq uint64
		if !async {
			seq = batch.Seq(i)
		}
		info.acks.journaled(seq, !async)
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

// OnWillSent journals a will the gateway ingests (a Sparkplug NDEATH) as
// the client's QoS 0 publication, with the identity it is bound to: mochi
// publishes wills without OnPublish. It runs in the client's goroutine as
// its connection ends, before OnDisconnect. A will on a topic the client
// may not publish to was dropped at CONNECT.
func (h *hook) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline || !h.b.in.WillTopic(pk.TopicName) {
		return
	}
	if _, _, err := h.b.j.Publish(cl.ID, h.ownDevice(cl), nil, 0, 0, pk.TopicName, pk.Payload, false); err != nil {
		h.b.log.Warn("will not journaled (the journal is closed or failed)", "client", cl.ID, "topic", pk.TopicName, "err", err)
	}
}

// overReceiveMaximum disconnects a client that sent a QoS 1/2 publication
// with mqtt.receive_maximum QoS 2 exchanges open (MQTT 5: DISCONNECT 0x93,
// [MQTT-3.3.4-9]): their PUBRELs come after it on the connection, so
// holding it until one ends would wait for good. (QoS 1 publications in
// flight are flow-controlled instead: see ackWriter.admit.)
func (h *hook) overReceiveMaximum(cl *mqtt.Client) error {
	b := h.b
	b.mqttRefused[RefusedReceiveMaximum].Add(1)
	if ok, held := b.logLimiter.Allow("receive-max", b.now()); ok {
		b.log.Warn("mqtt client disconnected: more QoS 1/2 publications in flight than mqtt.receive_maximum",
			"client", cl.ID, "remote", cl.Net.Remote, "receive_maximum", b.opts.ReceiveMaximum, "suppressed_since_last", held)
	}
	if cl.Properties.ProtocolVersion == 5 {
		_ = b.server.DisconnectClient(cl, packets.ErrReceiveMaximum)
	} else {
		cl.Stop(packets.ErrReceiveMaximum) // 3.1.1 has no DISCONNECT from the server
	}
	return packets.ErrRejectPacket
}

// ownDevice returns the only device a client's readings may name: its
// identity, for the device role (whose ACL binds the {device} level of
// reading topics to it, and which must not name another device in a
// payload either, e.g. SenML's bn on a topic without {device}); empty
// for other roles. The journal records it, so that the applier, which
// knows the device only after decoding, decides the same at replay.
func (h *hook) ownDevice(cl *mqtt.Client) string {
	if v, ok := h.clients.Load(cl); ok {
		if info := v.(*clientInfo); info.role == h.acl.Roles["device"] {
			return info.identity
		}
	}
	return ""
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
		h.b.j.SessionEnd(cl.ID)
		h.sessions.remove(cl.ID)
	}
	if persistent(cl) {
		if v, ok := h.clients.Load(cl); ok {
			h.sessions.set(cl.ID, v.(*clientInfo).owner(), true, time.Time{})
		}
		h.b.j.SessionStart(cl.ID, journal.Session{Proto: cl.Properties.ProtocolVersion, Expiry: cl.Properties.Props.SessionExpiryInterval,
			Username: string(cl.Properties.Username), Listener: cl.Net.Listener})
	}
}

// OnDisconnect journals the end of a session that expires with its
// connection.
func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if v, ok := h.clients.LoadAndDelete(cl); ok && !expire {
		// What the client received is journaled before its session can
		// resume (a takeover ends this connection before the new one is
		// read); a session that ends drops duplicate detection anyway.
		if upto, ok := v.(*clientInfo).acks.ended(time.Now()); ok {
			h.b.j.Received(cl.ID, upto)
		}
	}
	if cl.Net.Inline {
		return
	}
	if cl.IsTakenOver() {
		// The session, if any, is the new connection's, which journaled
		// what became of it (OnSessionEstablished): an end journaled here
		// could land after the new session's start and end it.
		return
	}
	if expire {
		h.b.j.SessionEnd(cl.ID)
	}
	if expire {
		h.sessions.remove(cl.ID)
		return
	}
	// Away (or restored at start, when mochi calls this for each
	// session): a named client's identity was its username.
	o := owner{name: string(cl.Properties.Username)}
	if o.name == "" {
		o = owner{name: cl.ID, anonymous: true}
	}
	h.sessions.away(cl.ID, o, h.b.now().Add(h.b.sessionExpiry(cl)))
}

// OnClientExpired journals the end of a session that outlived its
// connection and has now expired, and removes its subscriptions: mochi
// forgets the client but would leave them in its topic index for good.
func (h *hook) OnClientExpired(cl *mqtt.Client) {
	h.sessions.remove(cl.ID)
	h.b.server.UnsubscribeClient(cl)
	h.b.j.SessionEnd(cl.ID)
}

// pingBurst is how many PINGREQs a client may send at once beyond
// mqtt.ping_rate_per_client.
const pingBurst = 10

// errPingRate ends a connection whose client sends PINGREQs faster than
// mqtt.ping_rate_per_client.
var errPingRate = errors.New("PINGREQs faster than mqtt.ping_rate_per_client")

// pinged takes a PINGREQ from cl's ping budget: a client pings at most
// once per keep alive, so one that floods PINGREQs (each costs a read and
// a PINGRESP, a core at full speed) is disconnected and counted.
func (h *hook) pinged(cl *mqtt.Client) error {
	b := h.b
	rate := b.opts.PingRate
	if rate <= 0 {
		return nil
	}
	v, ok := h.clients.Load(cl)
	if !ok {
		return nil
	}
	info := v.(*clientInfo)
	if info.pings.Take(time.Now(), rate, pingBurst) == 0 {
		return nil
	}
	b.mqttRefused[RefusedPingRate].Add(1)
	if ok, held := b.logLimiter.Allow("ping-rate", b.now()); ok {
		b.log.Warn("mqtt client disconnected: PINGREQs faster than mqtt.ping_rate_per_client",
			"client", cl.ID, "remote", cl.Net.Remote, "suppressed_since_last", held)
	}
	// mochi ends the connection only on ErrRejectPacket from this hook.
	return fmt.Errorf("%w: %w", packets.ErrRejectPacket, errPingRate)
}

// OnPacketRead journals the end of a QoS 2 exchange a client began, as
// its PUBREL is read, and waits until that is durable: mochi sends
// PUBCOMP once this returns, and the client may then reuse the packet id.
// Journaled after the PUBCOMP, a crash in between would restore the
// exchange, and the client's next QoS 2 publication with that id would get
// PUBREC ("in use"; a 3.1.1 client sees success) without being journaled.
// Only the client's own goroutine waits. If the journal fails, the
// connection ends without PUBCOMP and the client sends the PUBREL again.
//
// A QoS 2 PUBLISH without DUP whose packet id is that of an exchange held
// open ends that exchange first: a client resends only with DUP
// [MQTT-3.3.1-1] and reuses an id only after PUBCOMP, so the exchange is
// stale (restored by an older gateway, or its PUBREL was lost with the
// connection) and this is a new publication; mochi would answer it with
// PUBREC "in use" without OnPublish, and it would never be journaled. The
// end is journaled before the publication, in the same or an earlier
// batch, so its PUBREC waits for both.
func (h *hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	if v, ok := h.clients.Load(cl); ok {
		w := &v.(*clientInfo).acks
		w.readNext()
		if pk.FixedHeader.Type == packets.Disconnect {
			w.disconnecting()
		}
	}
	switch pk.FixedHeader.Type {
	case packets.Pingreq:
		return pk, h.pinged(cl)
	case packets.Pubrel:
	case packets.Publish:
		if pk.FixedHeader.Qos != 2 || pk.FixedHeader.Dup {
			return pk, nil
		}
	default:
		return pk, nil
	}
	if pki, ok := cl.State.Inflight.Get(pk.PacketID); !ok || pki.FixedHeader.Type != packets.Pubrec {
		return pk, nil // not an exchange of ours: mochi answers a PUBREL with 0x92
	}
	batch, err := h.b.j.Pubrel(cl.ID, pk.PacketID)
	if err == nil && pk.FixedHeader.Type == packets.Pubrel {
		err = batch.Wait()
	}
	if err != nil {
		return pk, fmt.Errorf("journal pubrel: %w", err)
	}
	if pk.FixedHeader.Type == packets.Publish && cl.State.Inflight.Delete(pk.PacketID) {
		atomic.AddInt64(&h.b.server.Info.Inflight, -1)
		cl.State.Inflight.IncreaseReceiveQuota()
		h.released(cl)
		h.b.bounds.queued.freed(cl, pk.PacketID) // one store for both directions, by packet id
	}
	return pk, nil
}

// OnQosComplete counts the end of a QoS 2 exchange a client began (its
// PUBREL was answered; journaled by OnPacketRead). Completions of the
// broker's own deliveries are not state.
func (h *hook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Pubrel && !cl.Net.Inline {
		h.released(cl)
	}
}

// OnQosDropped: a PUBREL with an error reason ends the exchange too.
func (h *hook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Pubrel && !cl.Net.Inline {
		h.released(cl)
	}
}

// released counts the end of a QoS 2 exchange of a connected client.
func (h *hook) released(cl *mqtt.Client) {
	if v, ok := h.clients.Load(cl); ok {
		v.(*clientInfo).acks.released()
	}
}

// StoredInflightMessages gives mochi, as it starts, the QoS 2 exchanges
// awaiting PUBREL, as in-flight PUBRECs: it resends them when the client
// resumes its session, and answers its PUBREL with PUBCOMP.
func (h *hook) StoredInflightMessages() ([]storage.Message, error) {
	var v []storage.Message
	for id, pids := range h.b.restored.AwaitingRelease {
		for pid := range pids {
			v = append(v, storage.Message{T: storage.InflightKey, ID: fmt.Sprintf("if_%s_%d", id, pid), Client: id, Origin: id,
				PacketID: pid, FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, Created: h.b.now().Unix()})
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
		info := v.(*clientInfo)
		info.subscribing.Store(nil)
		info.acks.subscribed.Store(true)
	}
	for i, f := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		h.subs.add(cl.ID, f.Filter)
		if cl.Net.Inline {
			continue
		}
		h.b.j.Subscribe(cl.ID, f.Filter, journal.Subscription{QoS: f.Qos, RetainHandling: f.RetainHandling, NoLocal: f.NoLocal,
			RetainAsPublished: f.RetainAsPublished, Identifier: f.Identifier})
	}
}

// OnUnsubscribed journals the end of subscriptions. When a session is
// taken over, mochi unsubscribes the old connection after the new one has
// inherited its subscriptions: that is not an end. (A clean start that
// takes over a session unsubscribes it before marking it taken over: an
// end, which mochi's index shows too.)
func (h *hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	for _, f := range pk.Filters {
		h.subs.remove(cl.ID, f.Filter)
		if !cl.Net.Inline {
			h.b.j.Unsubscribe(cl.ID, f.Filter)
		}
	}
}

// StoredSubscriptions gives mochi, as it starts, the subscriptions of the
// persistent sessions.
func (h *hook) StoredSubscriptions() ([]storage.Subscription, error) {
	var v []storage.Subscription
	for id, subs := range h.b.restored.Subscriptions {
		if _, ok := h.b.restored.Sessions[id]; !ok {
			continue
		}
		for f, s := range subs {
			v = append(v, storage.Subscription{T: storage.SubscriptionKey, ID: id + ":" + f, Client: id, Filter: f, Qos: s.QoS,
				RetainHandling: s.RetainHandling, NoLocal: s.NoLocal, RetainAsPublished: s.RetainAsPublished, Identifier: s.Identifier})
			h.subs.add(id, f)
		}
	}
	// mochi does not count the subscriptions it loads (its $SYS topics
	// report the count): count them here, before the listeners accept
	// anyone.
	atomic.AddInt64(&h.b.server.Info.Subscriptions, int64(len(v)))
	return v, nil
}

// StoredClients gives mochi, as it starts, the persistent sessions the
// journal holds.
func (h *hook) StoredClients() ([]storage.Client, error) {
	v := make([]storage.Client, 0, len(h.b.restored.Sessions))
	for id, s := range h.b.restored.Sessions {
		v = append(v, storage.Client{ID: id, T: storage.ClientKey, ProtocolVersion: s.Proto, Username: []byte(s.Username),
			Listener: s.Listener, Properties: storage.ClientProperties{SessionExpiryInterval: s.Expiry, SessionExpiryIntervalFlag: s.Proto == 5}})
	}
	return v, nil
}
