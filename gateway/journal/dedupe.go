package journal

import (
	"maps"
	"slices"
)

// Dedupe recognises a QoS 1/2 publication that a device sends again (DUP
// set, same packet id, same topic and payload) because the acknowledgement
// of a journaled first copy never reached it: the connection broke, or
// the gateway restarted, before the client had its PUBACK (or PUBREC).
//
// A client may resend any publication whose acknowledgement it has not
// received, with any window and however many of them were in flight, so
// each client keeps one entry per packet id: that of its latest
// publication with the id, until the gateway knows the client received
// its acknowledgement. A client reuses a packet id only once it has the
// acknowledgement of the id's earlier publication, so a publication
// without DUP replaces the id's entry, and a DUP is a resend of the id's
// latest publication only. (Firmware with one publication in flight uses
// the same id for every reading: a new reading whose first copy was lost,
// resent with DUP, is no duplicate of the one before, though it may carry
// the same value; see Received.)
//
// The gateway learns that a client received its acknowledgements from the
// client's TCP stack (package broker; journaled as KindReceived): entries
// up to then are dropped, so a client holds about as many entries as it
// publishes in two seconds, at most one per packet id (65,535).
type Dedupe struct {
	max   int // clients kept; the least recently used goes first
	Rings map[string]*Ring
	// perClient and total bound the entries of one client and of all;
	// beyond them the oldest go (Evicted counts them): the likeliest to
	// have been received long ago, their receipt not learnt (a connection
	// shorter than the receipts' lag, a client that never sent DISCONNECT).
	perClient, total int
	Evicted          uint64
}

// Entry bounds of duplicate detection, at 24 bytes an entry (about 30 in
// a Go map): a client keeps at most DefaultPerClient (240 KiB), twice
// what flow control lets one connection have unreceived at the default
// mqtt.receive_maximum, and all clients DefaultTotal (7.5 MiB).
const (
	DefaultPerClient = 8192
	DefaultTotal     = 1 << 18
)

// Ring is one client's entries: its publications whose acknowledgement it
// may not have received, one per packet id.
type Ring struct {
	ents map[uint16]dupEntry
	used uint64 // journal sequence of the client's latest publication
	// since is the journal sequence of the client's latest connection
	// (its session start): entries before it were published on an
	// earlier connection.
	since uint64
}

// dupEntry is 48 bits of a publication's content hash and the journal
// sequence of its latest copy. A false match needs a DUP publication whose
// 48-bit hash equals the one entry of its packet id: about 1 in 10^14.
type dupEntry struct {
	hash uint64
	seq  uint64
}

const hashMask = 1<<48 - 1

// NewDedupe returns duplicate detection for at most max clients, with
// the entry bounds DefaultPerClient and DefaultTotal.
func NewDedupe(max int) *Dedupe {
	return &Dedupe{max: max, Rings: map[string]*Ring{}, perClient: DefaultPerClient, total: DefaultTotal}
}

// Bound sets the entry bounds (for tests).
func (d *Dedupe) Bound(perClient, total int) { d.perClient, d.total = perClient, total }

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

// Publication records client's journaled QoS 1/2 publication seq and
// reports whether it is a resend of one already journaled: the content of
// the latest publication with its packet id, whose acknowledgement the
// client may not have received, and either DUP set or (a client that
// resends without DUP, as MQTT.js does) published on an earlier
// connection. Within a connection a publication without DUP is always new:
// clients resend only when they reconnect, and firmware that uses one
// packet id for every reading reuses it as soon as it has the PUBACK. A
// resend takes the entry over (its acknowledgement is the one the client
// now waits for).
func (d *Dedupe) Publication(client []byte, pid uint16, hash uint64, dup bool, seq uint64) bool {
	r := d.Rings[string(client)]
	if r == nil {
		if len(d.Rings) >= d.max {
			d.evict()
		}
		r = &Ring{ents: map[uint16]dupEntry{}}
		d.Rings[string(client)] = r
	}
	r.used = seq
	hash &= hashMask
	e, ok := r.ents[pid]
	resend := ok && e.hash == hash && (dup || e.seq < r.since)
	r.ents[pid] = dupEntry{hash, seq}
	if len(r.ents) > d.perClient {
		d.trim(r, d.perClient*3/4)
	}
	return resend
}

// trim drops r's oldest entries until it has keep.
func (d *Dedupe) trim(r *Ring, keep int) {
	if keep <= 0 {
		d.Evicted += uint64(len(r.ents))
		clear(r.ents)
		return
	}
	seqs := make([]uint64, 0, len(r.ents))
	for _, e := range r.ents {
		seqs = append(seqs, e.seq)
	}
	slices.Sort(seqs)
	cut := seqs[len(seqs)-keep] // entries before it go
	n := len(r.ents)
	maps.DeleteFunc(r.ents, func(_ uint16, e dupEntry) bool { return e.seq < cut })
	d.Evicted += uint64(n - len(r.ents))
}

// Bounded enforces the bound on all clients' entries, halving the largest
// client's until they are within it. The applier calls it at each tick,
// so that it depends on the journal alone.
func (d *Dedupe) Bounded() {
	for d.Entries() > d.total {
		var big *Ring
		for _, r := range d.Rings {
			if big == nil || len(r.ents) > len(big.ents) {
				big = r
			}
		}
		d.trim(big, len(big.ents)/2)
	}
}

// Connected notes that client connected again (its session start was
// journaled as seq).
func (d *Dedupe) Connected(client []byte, seq uint64) {
	if r := d.Rings[string(client)]; r != nil {
		r.since = seq
	}
}

// Received ends client's entries of publications journaled up to seq
// upto: the client has their acknowledgements and never resends them.
func (d *Dedupe) Received(client []byte, upto uint64) {
	r := d.Rings[string(client)]
	if r == nil {
		return
	}
	maps.DeleteFunc(r.ents, func(_ uint16, e dupEntry) bool { return e.seq <= upto })
	if len(r.ents) == 0 {
		delete(d.Rings, string(client))
	}
}

// Released ends the entry of client's QoS 2 publication pid: its PUBREL
// says the client has the PUBREC.
func (d *Dedupe) Released(client []byte, pid uint16) {
	if r := d.Rings[string(client)]; r != nil {
		delete(r.ents, pid)
	}
}

// Entries returns the number of entries held, of all clients.
func (d *Dedupe) Entries() int {
	n := 0
	for _, r := range d.Rings {
		n += len(r.ents)
	}
	return n
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

// Drop ends client's duplicate detection (its session ended).
func (d *Dedupe) Drop(client []byte) { delete(d.Rings, string(client)) }

// sortedEntries returns r's entries by packet id, for encoding.
func (r *Ring) sortedEntries() []uint16 { return slices.Sorted(maps.Keys(r.ents)) }
