package broker

import (
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Drop is the bound that made the broker drop a message for a session.
type Drop int

// Reasons for drops, counted in Stats.QueuedDropped.
const (
	DropSessionBytes Drop = iota // mqtt.max_queued_bytes_per_session
	DropTotalBytes               // mqtt.max_queued_bytes
	nDrops
)

var dropNames = [nDrops]string{"session_bytes", "total_bytes"}

func (d Drop) String() string { return dropNames[d] }

// queued accounts for the QoS 1/2 messages mochi holds for subscribers,
// by session: a copy of each is kept in the session's in-flight store
// from the moment it is routed until the subscriber acknowledges it, for
// up to a day, and for an away persistent session every message routed
// while it is away (mochi bounds them at 8,192 a session, by count only).
//
// Once a session holds its bound, or all of them hold the total bound,
// room refuses the messages routed to it (hook's OnACLCheck asks, as mochi
// asks before it copies a message into a session), and they are dropped
// for that session and counted. room cannot know the size of the message
// it is asked about, so a session holds at most its bound plus one
// message, and all sessions the total plus one message per client
// publishing at once. It cannot know the message's QoS either: a
// connected subscriber over its bound (one that does not acknowledge) has
// its QoS 0 messages dropped too, until it acknowledges.
//
// The account follows mochi's in-flight store through the hook's events:
// a message is counted as mochi stores it (OnQosPublish) and freed once
// mochi no longer holds its packet id (OnQosComplete, OnQosDropped: an
// acknowledgement, an expiry, a rejection).
type queued struct {
	perSession, total int64

	mu       sync.Mutex
	sessions map[string]*sessionQueue // by client id
	bytes    int64                    // of all the sessions

	dropped [nDrops]atomic.Int64
}

// sessionQueue is one session's messages in mochi's in-flight store.
type sessionQueue struct {
	bytes int64
	pids  map[uint16]int64 // packet id → cost
	// dirty: mochi dropped a message from the store without an event
	// (OnPublishDropped comes before it does): reconcile before use.
	dirty bool
}

// room reports whether a message may be routed to cl's session; if not,
// the drop is counted and logged.
func (q *queued) room(b *Broker, cl *mqtt.Client) bool {
	q.mu.Lock()
	s := q.sessions[cl.ID]
	if s != nil && s.dirty {
		q.reconcile(cl, s)
	}
	why := nDrops
	switch {
	case s != nil && s.bytes >= q.perSession:
		why = DropSessionBytes
	case q.bytes >= q.total:
		why = DropTotalBytes
	}
	var held int64
	if s != nil {
		held = s.bytes
	}
	q.mu.Unlock()
	if why == nDrops {
		return true
	}
	q.dropped[why].Add(1)
	if ok, suppressed := b.logLimiter.Allow("queued", b.now()); ok {
		b.log.Warn("mqtt message dropped for a subscriber: it holds too many unacknowledged bytes ("+why.String()+")",
			"client", cl.ID, "connected", !cl.Closed(), "session_bytes", held, "suppressed_since_last", suppressed)
	}
	return false
}

// reconcile frees what mochi no longer holds for s.
func (q *queued) reconcile(cl *mqtt.Client, s *sessionQueue) {
	for pid, cost := range s.pids {
		if _, ok := cl.State.Inflight.Get(pid); !ok {
			delete(s.pids, pid)
			s.bytes -= cost
			q.bytes -= cost
		}
	}
	s.dirty = false
}

// stored counts a message mochi stored for cl (again, when resent).
func (q *queued) stored(cl *mqtt.Client, pid uint16, cost int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.sessions == nil {
		q.sessions = map[string]*sessionQueue{}
	}
	s := q.sessions[cl.ID]
	if s == nil {
		s = &sessionQueue{pids: map[uint16]int64{}}
		q.sessions[cl.ID] = s
	}
	d := cost - s.pids[pid]
	s.pids[pid] = cost
	s.bytes += d
	q.bytes += d
}

// freed frees a packet id of cl's once mochi no longer holds it. (mochi
// keeps the client's QoS exchanges in both directions in one store, by
// packet id: one ends what it holds under that id.)
func (q *queued) freed(cl *mqtt.Client, pid uint16) {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.sessions[cl.ID]
	if s == nil {
		return
	}
	cost, ok := s.pids[pid]
	if !ok {
		return
	}
	if _, held := cl.State.Inflight.Get(pid); held {
		return
	}
	delete(s.pids, pid)
	s.bytes -= cost
	q.bytes -= cost
}

// forget frees a session's account: mochi discarded its in-flight store.
func (q *queued) forget(cid string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.sessions[cid]; s != nil {
		q.bytes -= s.bytes
		delete(q.sessions, cid)
	}
}

// held returns the bytes held and the drops by reason.
func (q *queued) held() (int64, map[string]int64) {
	q.mu.Lock()
	bytes := q.bytes
	q.mu.Unlock()
	m := make(map[string]int64, nDrops)
	for i := range q.dropped {
		m[dropNames[i]] = q.dropped[i].Load()
	}
	return bytes, m
}

// OnQosPublish counts a message mochi stored in a session's in-flight
// store to send it (the acknowledgements of a client's own publications
// it stores there too are not counted).
func (h *bounds) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, resends int) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline {
		return
	}
	h.queued.stored(cl, pk.PacketID, messageCost(pk))
}

// OnQosComplete frees an acknowledged message.
func (h *bounds) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	h.queued.freed(cl, pk.PacketID)
}

// OnQosDropped frees a message rejected by its subscriber or expired.
func (h *bounds) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	h.queued.freed(cl, pk.PacketID)
}

// OnPublishDropped: mochi is about to take a message the client's write
// queue had no room for out of its in-flight store, without an event.
func (h *bounds) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	h.queued.mu.Lock()
	defer h.queued.mu.Unlock()
	if s := h.queued.sessions[cl.ID]; s != nil {
		s.dirty = true
	}
}

// OnSessionEstablish: a clean start discards the session's in-flight
// store; a resumed session keeps it, and its account. (It runs before
// mochi lists the client, so before anything is routed to it.)
func (h *bounds) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	if pk.Connect.Clean && !cl.Net.Inline {
		h.queued.forget(cl.ID)
	}
}

// OnDisconnect frees the account of a session that ends with its
// connection (a session taken over is the new connection's).
func (h *bounds) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if expire && !cl.IsTakenOver() {
		h.queued.forget(cl.ID)
	}
}

// OnClientExpired frees the account of an expired session.
func (h *bounds) OnClientExpired(cl *mqtt.Client) {
	h.queued.forget(cl.ID)
}
