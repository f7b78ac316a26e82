package broker

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgegate/edgegate/gateway/broker/auth"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Client ids and sessions. A client id names a session, and whoever
// connects with it takes the session over and disconnects the client that
// had it. So:
//
//   - a device's client id is bound to its identity (ClientIDRule): it
//     cannot take another device's id, nor squat one before it connects;
//   - a client id whose session or connection belongs to another identity
//     cannot be taken, whatever the role (admin aside);
//   - persistent sessions (kept for up to mqtt.max_session_expiry after
//     their client leaves, in mochi, the journal and every checkpoint) are
//     capped per identity and in total: a new one ends the session of the
//     same identity (or, for the total, of anyone) closest to its expiry
//     whose client is away, and is refused when every one is connected;
//   - anonymous clients are each an identity of their own (the client
//     id), so the cap per identity does not bound them: their persistent
//     sessions are capped together at half of the total
//     (anonymousSessions), and an anonymous newcomer only ever ends an
//     anonymous session. A flood of new anonymous client ids then ends
//     its own sessions, never the away session of a named identity.

// ClientIDRule says which client ids a client of the device role may use.
type ClientIDRule string

// Client id rules.
const (
	// ClientIDPrefixed: the identity, or the identity followed by ':' and
	// anything ("dev-01", "dev-01:ota"). No identity contains ':', so the
	// identity a client id belongs to is the part before its first ':'.
	ClientIDPrefixed ClientIDRule = "prefixed"
	ClientIDIdentity ClientIDRule = "identity" // the identity only
	ClientIDAny      ClientIDRule = "any"      // no binding
)

// ClientIDSeparator ends the identity part of a client id under
// ClientIDPrefixed.
const ClientIDSeparator = auth.ClientIDSeparator

// allows reports whether a client with identity id may use client id cid.
func (r ClientIDRule) allows(id, cid string) bool {
	switch r {
	case ClientIDAny:
		return true
	case ClientIDIdentity:
		return cid == id
	}
	owner, _, _ := strings.Cut(cid, ClientIDSeparator)
	return owner == id
}

// owner is who a session or connection belongs to. Anonymous clients are
// apart from named ones (users and certificates, which share names: a
// device with a certificate and a password is one device).
type owner struct {
	name      string
	anonymous bool
}

func (o owner) String() string {
	if o.anonymous {
		return "anonymous client " + o.name
	}
	return o.name
}

// session is a persistent session the broker holds.
type session struct {
	owner     owner
	connected bool
	expires   time.Time // when mochi would end it, if its client stays away
}

// sessions tracks the persistent sessions by client id.
type sessions struct {
	mu      sync.Mutex
	by      map[string]*session
	evicted atomic.Uint64
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.by)
}

func (s *sessions) owner(cid string) (owner, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.by[cid]; ok {
		return e.owner, true
	}
	return owner{}, false
}

// set records cid's session as connected (or, with connected false and
// expires, as away).
func (s *sessions) set(cid string, o owner, connected bool, expires time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]*session{}
	}
	s.by[cid] = &session{owner: o, connected: connected, expires: expires}
}

// away marks cid's session as away until expires; a session the hook has
// not seen (one mochi restored at start) is recorded with o.
func (s *sessions) away(cid string, o owner, expires time.Time) {
	s.mu.Lock()
	e := s.by[cid]
	s.mu.Unlock()
	if e == nil {
		s.set(cid, o, false, expires)
		return
	}
	s.mu.Lock()
	e.connected, e.expires = false, expires
	s.mu.Unlock()
}

func (s *sessions) remove(cid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.by, cid)
}

// anonymousSessions is the cap on anonymous clients' persistent sessions
// together, given mqtt.max_sessions: half, so that named identities
// (devices with passwords or certificates, dashboards) always have the
// other half whatever anonymous clients do; at least one.
func anonymousSessions(maxSessions int) int { return max(1, maxSessions/2) }

// scope says which sessions a cap counts, and which of them a newcomer
// may end to make room.
type scope struct {
	count, evict func(owner) bool
}

// victim returns the client id of the away session closest to its expiry
// among those sc may end, and how many sessions sc counts. A session
// recorded as connected whose client live says is gone (its connection
// failed before mochi reported an end) counts as away, first.
func (s *sessions) victim(sc scope, live func(cid string) bool) (cid string, n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *session
	for id, e := range s.by {
		if !sc.count(e.owner) {
			continue
		}
		n++
		if !sc.evict(e.owner) || e.connected && live(id) {
			continue
		}
		expires := e.expires
		if e.connected {
			expires = time.Time{}
		}
		if best == nil || expires.Before(best.expires) || expires.Equal(best.expires) && id < cid {
			best, cid = &session{expires: expires}, id
		}
	}
	return cid, n, best != nil
}

// sessionExpiry returns how long cl's session outlives its connection.
func (b *Broker) sessionExpiry(cl *mqtt.Client) time.Duration {
	d := b.opts.MaxSessionExpiry
	if cl.Properties.ProtocolVersion == 5 {
		d = min(d, time.Duration(cl.Properties.Props.SessionExpiryInterval)*time.Second)
	}
	return d
}

// ownerOf returns who the client id cid belongs to now: the client
// connected with it, else its persistent session.
func (h *hook) ownerOf(cid string) (owner, bool) {
	if cl, ok := h.b.server.Clients.Get(cid); ok {
		if v, ok := h.clients.Load(cl); ok {
			return v.(*clientInfo).owner(), true
		}
	}
	return h.sessions.owner(cid)
}

// admitSession decides whether cl, authenticated as info, may connect
// with its client id and, for a new persistent session, makes room for it.
// On refusal it has sent the CONNACK and returns the reason.
func (h *hook) admitSession(cl *mqtt.Client, info *clientInfo) (Refusal, string, bool) {
	b := h.b
	me := info.owner()
	admin := info.role == h.acl.Roles["admin"]
	if info.role == h.acl.Roles["device"] && !info.anonymous && !b.opts.ClientIDs.allows(info.identity, cl.ID) {
		return h.refuseClientID(cl, fmt.Sprintf("client id not allowed for identity %q (mqtt.device_client_ids: %s)", info.identity, b.opts.ClientIDs))
	}
	if o, ok := h.ownerOf(cl.ID); ok && o != me && !admin {
		return h.refuseClientID(cl, fmt.Sprintf("client id in use by %s", o))
	}
	if !persistent(cl) {
		return 0, "", true
	}
	if _, resumed := h.sessions.owner(cl.ID); resumed {
		// Connected from now, as a new one is: OnSessionEstablished
		// comes after the CONNACK, and a CONNECT read meanwhile would
		// find this session away and could end it to make room.
		h.sessions.set(cl.ID, me, true, time.Time{})
		return 0, "", true
	}
	mine := func(o owner) bool { return o == me }
	anonymous := func(o owner) bool { return o.anonymous }
	anyone := func(owner) bool { return true }
	type sessionCap struct {
		sc    scope
		limit int
		key   string
	}
	caps := []sessionCap{
		{scope{mine, mine}, b.opts.MaxSessionsPerIdentity, "mqtt.max_sessions_per_identity"},
		{scope{anyone, anyone}, b.opts.MaxSessions, "mqtt.max_sessions"},
	}
	if me.anonymous {
		caps = []sessionCap{
			caps[0],
			{scope{anonymous, anonymous}, anonymousSessions(b.opts.MaxSessions), "anonymous clients' half of mqtt.max_sessions"},
			{scope{anyone, anonymous}, b.opts.MaxSessions, "mqtt.max_sessions; an anonymous client ends anonymous sessions only"},
		}
	}
	for _, c := range caps {
		for {
			victim, n, ok := h.sessions.victim(c.sc, h.live)
			if c.limit <= 0 || n < c.limit {
				break
			}
			if !ok {
				code := packets.ErrQuotaExceeded
				if cl.Properties.ProtocolVersion < 5 {
					code = packets.Err3ServerUnavailable
				}
				_ = b.server.SendConnack(cl, code, false, nil)
				return RefusedSessionLimit, fmt.Sprintf("%d persistent sessions, none it may end away (%s)", n, c.key), false
			}
			h.endSession(victim)
		}
	}
	// Counted from now, so that the next CONNECT sees it: OnSessionEstablished
	// comes after the CONNACK.
	h.sessions.set(cl.ID, me, true, time.Time{})
	return 0, "", true
}

// live reports whether a client is connected with client id cid (mochi
// lists a client just before its CONNACK).
func (h *hook) live(cid string) bool {
	cl, ok := h.b.server.Clients.Get(cid)
	return ok && !cl.Closed()
}

func (h *hook) refuseClientID(cl *mqtt.Client, why string) (Refusal, string, bool) {
	_ = h.b.server.SendConnack(cl, packets.ErrClientIdentifierNotValid, false, nil) // 3.1.1: identifier rejected
	return RefusedClientID, why, false
}

// endSession ends the persistent session of an away client early, as
// mochi does at its expiry.
func (h *hook) endSession(cid string) {
	h.sessions.remove(cid)
	h.sessions.evicted.Add(1)
	if cl, ok := h.b.server.Clients.Get(cid); ok && cl.Closed() && !cl.IsTakenOver() {
		h.b.server.UnsubscribeClient(cl)
		cl.ClearInflights()
		h.b.bounds.queued.forget(cid)
		h.b.server.Clients.Delete(cid)
	}
	h.b.j.SessionEnd(cid)
	if ok, held := h.b.logLimiter.Allow("session-evicted", h.b.now()); ok {
		h.b.log.Info("persistent mqtt session ended early to make room (mqtt.max_sessions, mqtt.max_sessions_per_identity)",
			"client", cid, "suppressed_since_last", held)
	}
}
