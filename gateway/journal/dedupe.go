package journal

import (
	"slices"
)

// Dedupe recognises a QoS 1/2 publication that a device sends again (DUP
// set, same packet id, same topic and payload) because the PUBACK of a
// journaled first copy never reached it, typically across a gateway
// restart. A device resends only publications still in flight, at most
// mqtt.receive_maximum of them, all among its latest publications; so each
// client keeps a ring of the packet ids and content hashes of its latest
// receive_maximum journaled publications (the broker disconnects a client
// with more in flight, QoS 1 and 2 alike, so the ring is long enough). A
// packet id is reused only after its PUBACK arrived, so a publication
// without DUP that reuses an id ends the entry of the id's earlier
// publication (Forget): a DUP is then a resend of the new one only. Firmware
// with one publication in flight uses the same id for every reading; with
// the entry kept, a new reading whose first copy was lost and whose resend
// (DUP) carries the value of an earlier one would be dropped.
type Dedupe struct {
	size  int // entries per ring
	max   int // rings kept; the least recently used goes first
	Rings map[string]*Ring
}

type Ring struct {
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

func NewDedupe(size, max int) *Dedupe {
	return &Dedupe{size: size, max: max, Rings: map[string]*Ring{}}
}

// ContentHash is FNV-1a (64 bit) of topic, a zero byte and payload: stable
// across restarts, unlike hash/maphash.
func ContentHash(topic, payload []byte) uint64 {
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

// Seen reports whether client's recent publications hold pid with hash.
func (d *Dedupe) Seen(client []byte, pid uint16, hash uint64) bool {
	r := d.Rings[string(client)]
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

// Add records a journaled publication.
func (d *Dedupe) Add(client []byte, pid uint16, hash, seq uint64) {
	r := d.Rings[string(client)]
	if r == nil {
		if len(d.Rings) >= d.max {
			d.evict()
		}
		r = &Ring{}
		d.Rings[string(client)] = r
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

// Forget ends the entries of client's packet id pid: a publication without
// DUP reuses it, so the earlier publications with that id were
// acknowledged and are never resent.
func (d *Dedupe) Forget(client []byte, pid uint16) {
	r := d.Rings[string(client)]
	if r == nil || !slices.ContainsFunc(r.ents, func(e dupEntry) bool { return e.pid() == pid }) {
		return
	}
	// Oldest first (a full ring starts at next), then without pid: the
	// ring is no longer full and fills by appending again.
	slices.Reverse(r.ents[:r.next])
	slices.Reverse(r.ents[r.next:])
	slices.Reverse(r.ents)
	r.ents = slices.DeleteFunc(r.ents, func(e dupEntry) bool { return e.pid() == pid })
	r.next = 0
}

func (d *Dedupe) evict() {
	var oldest string
	var used uint64
	first := true
	for c, r := range d.Rings {
		if first || r.used < used || r.used == used && c < oldest {
			oldest, used, first = c, r.used, false
		}
	}
	delete(d.Rings, oldest)
}

func (d *Dedupe) Drop(client []byte) { delete(d.Rings, string(client)) }
