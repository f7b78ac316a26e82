package gateway

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
)

// dedupe recognises a QoS 1/2 publication that a device sends again (DUP
// set, same packet id, same topic and payload) because the PUBACK of a
// journaled first copy never reached it, typically across a gateway
// restart. A device resends only publications still in flight, at most
// mqtt.receive_maximum of them, all among its latest publications; so each
// client keeps a ring of the packet ids and content hashes of its latest
// receive_maximum journaled publications. A packet id is reused only after
// its PUBACK arrived, so a resend of an acknowledged publication cannot
// occur; the one ambiguity left is a client that reuses a packet id for a
// new, identical publication while fewer than receive_maximum others were
// sent in between and then resends that one as DUP (packet ids are usually
// allocated round-robin, which rules it out).
type dedupe struct {
	size  int // entries per ring
	max   int // rings kept; the least recently used goes first
	rings map[string]*ring
}

type ring struct {
	ents []dupEntry // up to size; ents[next] is the oldest once full
	next int
	used uint64 // journal sequence of the client's latest publication
}

// dupEntry is a packet id (top 16 bits) and 48 bits of the content hash:
// 8 bytes, so 1,000 clients with a ring of 256 cost 2 MiB. A false match
// needs a DUP publication whose 48-bit hash equals one of 256 others with
// the same packet id: about 1 in 10^12.
type dupEntry uint64

func newDupEntry(pid uint16, hash uint64) dupEntry {
	return dupEntry(uint64(pid)<<48 | hash&(1<<48-1))
}

func (e dupEntry) pid() uint16  { return uint16(e >> 48) }
func (e dupEntry) hash() uint64 { return uint64(e) & (1<<48 - 1) }

func newDedupe(size, max int) *dedupe {
	return &dedupe{size: size, max: max, rings: map[string]*ring{}}
}

// contentHash is FNV-1a (64 bit) of topic, a zero byte and payload: stable
// across restarts, unlike hash/maphash.
func contentHash(topic, payload []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range topic {
		h = (h ^ uint64(c)) * 1099511628211
	}
	h *= 1099511628211
	for _, c := range payload {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// seen reports whether client's recent publications hold pid with hash.
func (d *dedupe) seen(client []byte, pid uint16, hash uint64) bool {
	r := d.rings[string(client)]
	if r == nil {
		return false
	}
	want := newDupEntry(pid, hash)
	for _, e := range r.ents {
		if e == want {
			return true
		}
	}
	return false
}

// add records a journaled publication.
func (d *dedupe) add(client []byte, pid uint16, hash, seq uint64) {
	r := d.rings[string(client)]
	if r == nil {
		if len(d.rings) >= d.max {
			d.evict()
		}
		r = &ring{}
		d.rings[string(client)] = r
	}
	r.used = seq
	e := newDupEntry(pid, hash)
	if len(r.ents) < d.size {
		if len(r.ents) == cap(r.ents) { // grow by doubling, never past size
			r.ents = slices.Grow(r.ents, min(max(2*len(r.ents), 4), d.size)-len(r.ents))
		}
		r.ents = append(r.ents, e)
		return
	}
	r.ents[r.next] = e
	r.next = (r.next + 1) % len(r.ents)
}

func (d *dedupe) evict() {
	var oldest string
	var used uint64
	first := true
	for c, r := range d.rings {
		if first || r.used < used || r.used == used && c < oldest {
			oldest, used, first = c, r.used, false
		}
	}
	delete(d.rings, oldest)
}

func (d *dedupe) drop(client []byte) { delete(d.rings, string(client)) }

// A checkpoint is the gateway's state after the journal event at sequence
// seq was applied, stored in state.db (see statedb.go) with the closed
// windows it refers to:
//
//	magic "EGCP", version 1
//	uvarint seq, varint clock (Unix ns)
//	uvarint length + the aggregator's snapshot (closed windows are in the
//	  store, not here)
//	uvarint count, then per session: client, proto (1 byte), uvarint
//	  expiry, username, listener (strings as uvarint length + bytes)
//	uvarint count, then per dedupe ring: client, uvarint used, uvarint n,
//	  then n entries oldest first: uvarint pid, 8-byte hash
//	uvarint count, then per client with QoS 2 exchanges awaiting PUBREL:
//	  client, uvarint n, then n uvarint packet ids
//	uvarint count, then per client with subscriptions: client, uvarint n,
//	  then n × (filter, flags byte, uvarint subscription identifier)
//	CRC-32C of everything before it, 4 bytes little-endian
const (
	checkpointMagic   = "EGCP"
	checkpointVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pidSets holds, per client, packet ids of QoS 2 publications that were
// received and acknowledged with PUBREC, and whose PUBREL has not come.
// mochi gets them back at start (as in-flight PUBRECs), so a client that
// sends PUBREL after a restart gets PUBCOMP, not "packet id not found".
type pidSets map[string]map[uint16]bool

func (p pidSets) add(client string, pid uint16) {
	if p[client] == nil {
		p[client] = map[uint16]bool{}
	}
	p[client][pid] = true
}

func (p pidSets) remove(client string, pid uint16) {
	delete(p[client], pid)
	if len(p[client]) == 0 {
		delete(p, client)
	}
}

// checkpoint is a decoded checkpoint.
type checkpoint struct {
	seq      uint64
	clock    int64
	agg      []byte                // the aggregator's snapshot, as decoded
	snapshot func(b []byte) []byte // appends it, when encoding
	sessions map[string]session
	rings    map[string]*ring
	awaitRel pidSets
	subs     map[string]map[string]subscription
}

func (c *checkpoint) encode() []byte {
	b := append([]byte(checkpointMagic), checkpointVersion)
	b = binary.AppendUvarint(b, c.seq)
	b = binary.AppendVarint(b, c.clock)
	if c.snapshot != nil {
		// Encoded in place after room for its length, then moved up to
		// close the gap: no copy of the snapshot is allocated.
		at := len(b)
		b = append(b, make([]byte, binary.MaxVarintLen64)...)
		b = c.snapshot(b)
		var n [binary.MaxVarintLen64]byte
		l := binary.PutUvarint(n[:], uint64(len(b)-at-binary.MaxVarintLen64))
		copy(b[at:], n[:l])
		b = append(b[:at+l], b[at+binary.MaxVarintLen64:]...)
	} else {
		b = binary.AppendUvarint(b, uint64(len(c.agg)))
		b = append(b, c.agg...)
	}
	clients := slices.Sorted(maps.Keys(c.sessions))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		s := c.sessions[id]
		b = appendString(b, id)
		b = append(b, s.proto)
		b = binary.AppendUvarint(b, uint64(s.expiry))
		b = appendString(b, s.username)
		b = appendString(b, s.listener)
	}
	clients = slices.Sorted(maps.Keys(c.rings))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		r := c.rings[id]
		b = appendString(b, id)
		b = binary.AppendUvarint(b, r.used)
		b = binary.AppendUvarint(b, uint64(len(r.ents)))
		for i := range r.ents {
			e := r.ents[(r.next+i)%len(r.ents)]
			b = binary.AppendUvarint(b, uint64(e.pid()))
			b = binary.LittleEndian.AppendUint64(b, e.hash())
		}
	}
	clients = slices.Sorted(maps.Keys(c.awaitRel))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		b = appendString(b, id)
		pids := slices.Sorted(maps.Keys(c.awaitRel[id]))
		b = binary.AppendUvarint(b, uint64(len(pids)))
		for _, pid := range pids {
			b = binary.AppendUvarint(b, uint64(pid))
		}
	}
	clients = slices.Sorted(maps.Keys(c.subs))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		b = appendString(b, id)
		filters := slices.Sorted(maps.Keys(c.subs[id]))
		b = binary.AppendUvarint(b, uint64(len(filters)))
		for _, f := range filters {
			s := c.subs[id][f]
			b = appendString(b, f)
			b = append(b, s.flags())
			b = binary.AppendUvarint(b, uint64(s.identifier))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errCheckpoint = errors.New("damaged checkpoint")

func decodeCheckpoint(b []byte) (*checkpoint, error) {
	if len(b) < len(checkpointMagic)+1+4 || string(b[:4]) != checkpointMagic {
		return nil, fmt.Errorf("%w: no header", errCheckpoint)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch", errCheckpoint)
	}
	if body[4] != checkpointVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", errCheckpoint, body[4], checkpointVersion)
	}
	r := reader{b: body[5:], ok: true}
	c := &checkpoint{sessions: map[string]session{}, rings: map[string]*ring{}, awaitRel: pidSets{}, subs: map[string]map[string]subscription{}}
	c.seq = r.uvarint()
	c.clock = r.varint()
	c.agg = r.bytes()
	n := r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		var s session
		s.proto = r.byte()
		s.expiry = uint32(r.uvarint())
		s.username = string(r.bytes())
		s.listener = string(r.bytes())
		c.sessions[id] = s
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		rg := &ring{used: r.uvarint()}
		m := r.uvarint()
		if m > uint64(len(r.b)) {
			r.ok = false
			break
		}
		rg.ents = make([]dupEntry, 0, m)
		for j := uint64(0); r.ok && j < m; j++ {
			pid := uint16(r.uvarint())
			if len(r.b) < 8 {
				r.ok = false
				break
			}
			rg.ents = append(rg.ents, newDupEntry(pid, binary.LittleEndian.Uint64(r.b)))
			r.b = r.b[8:]
		}
		c.rings[id] = rg
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		m := r.uvarint()
		for j := uint64(0); r.ok && j < m; j++ {
			c.awaitRel.add(id, uint16(r.uvarint()))
		}
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		m := r.uvarint()
		c.subs[id] = map[string]subscription{}
		for j := uint64(0); r.ok && j < m; j++ {
			f := string(r.bytes())
			flags := r.byte()
			c.subs[id][f] = subscriptionOf(flags, int(r.uvarint()))
		}
	}
	if !r.ok || len(r.b) != 0 {
		return nil, fmt.Errorf("%w: bad field", errCheckpoint)
	}
	return c, nil
}
