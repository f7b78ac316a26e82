package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
)

// A checkpoint is the gateway's state after the journal event at sequence
// seq was applied, stored in state.db (see statedb.go) with the closed
// windows it refers to, the one before it in checkpoint.prev:
//
//	magic "EGCP", version 1
//	uvarint seq, varint clock (Unix ns)
//	uvarint length + the aggregator's snapshot (closed windows are in the
//	  store, not here)
//	uvarint count, then per session: client, proto (1 byte), uvarint
//	  expiry, username, listener (strings as uvarint length + bytes)
//	uvarint count, then per client of duplicate detection: client,
//	  uvarint used, uvarint n, then n entries: uvarint pid, 8-byte hash;
//	  version 3: then uvarint seq after each hash, entries by packet id,
//	  and after them uvarint since, the seq of the client's latest
//	  connection (versions 1 and 2 have the client's latest entries oldest
//	  first, read as of seq used, and no since)
//	uvarint count, then per client with QoS 2 exchanges awaiting PUBREL:
//	  client, uvarint n, then n uvarint packet ids
//	uvarint count, then per client with subscriptions: client, uvarint n,
//	  then n × (filter, flags byte, uvarint subscription identifier)
//	version 2: the time line (TimeLine): boot, flags byte (bit 0
//	  synchronized, bit 1 monotonic time valid), varint wall, varint
//	  monotonic, varint elapsed, varint offset; then the hold (Hold):
//	  uvarint start, records, readings, varint bytes, varint since,
//	  uvarint rebased, uvarint unverified
//	optional sections, each a tag byte and uvarint length + bytes: 'S' the
//	  Sparkplug host state (gateway/sparkplug); none when it is empty, and
//	  a tag not known is skipped
//	CRC-32C of everything before it, 4 bytes little-endian
const (
	checkpointMagic   = "EGCP"
	checkpointVersion = 3
)

// TimeLine is the applier's account of time after the checkpoint's event
// (see package gateway): a function of the journal, checkpointed so that a
// replay from the checkpoint goes on exactly as the first run did.
type TimeLine struct {
	Valid        bool   // false in version 1 checkpoints, which have none
	Boot         string // of the latest clock event
	Synchronized bool
	HasMono      bool  // Mono is a monotonic time of this boot
	Wall, Mono   int64 // of the latest event
	Elapsed      int64 // elapsed time: advances by monotonic time only
	Offset       int64 // gateway time minus wall time
}

// Hold is what the gateway holds of the readings it stamped while its
// clock was not synchronized (see package gateway): records in the hold
// log from Start on, not yet released.
type Hold struct {
	Start    uint64 // hold log sequence of the first record not released
	Records  uint64 // publications held
	Readings uint64 // readings in them
	Bytes    int64  // their size in the hold log
	Since    int64  // elapsed time (TimeLine.Elapsed) when the first was held
	// Readings released so far, re-based to true time or unverified
	// (counters).
	Rebased, Unverified uint64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// PIDSets holds, per client, packet ids of QoS 2 publications that were
// received and acknowledged with PUBREC, and whose PUBREL has not come.
// mochi gets them back at start (as in-flight PUBRECs), so a client that
// sends PUBREL after a restart gets PUBCOMP, not "packet id not found".
type PIDSets map[string]map[uint16]bool

func (p PIDSets) Add(client string, pid uint16) {
	if p[client] == nil {
		p[client] = map[uint16]bool{}
	}
	p[client][pid] = true
}

func (p PIDSets) Remove(client string, pid uint16) {
	delete(p[client], pid)
	if len(p[client]) == 0 {
		delete(p, client)
	}
}

// Checkpoint is a decoded checkpoint.
type Checkpoint struct {
	Seq      uint64
	Clock    int64
	Agg      []byte                // the aggregator's snapshot, as decoded
	Snapshot func(b []byte) []byte // appends it, when encoding
	Sessions map[string]Session
	Rings    map[string]*Ring
	AwaitRel PIDSets
	Subs     map[string]map[string]Subscription
	Time     TimeLine
	Hold     Hold
	// Sparkplug is the Sparkplug host state (gateway/sparkplug's
	// snapshot), opaque here; empty when there is none.
	Sparkplug []byte
}

// sectionSparkplug tags the Sparkplug host state section.
const sectionSparkplug = 'S'

func (c *Checkpoint) Encode() []byte {
	b := append([]byte(checkpointMagic), checkpointVersion)
	b = binary.AppendUvarint(b, c.Seq)
	b = binary.AppendVarint(b, c.Clock)
	if c.Snapshot != nil {
		// Encoded in place after room for its length, then moved up to
		// close the gap: no copy of the snapshot is allocated.
		at := len(b)
		b = append(b, make([]byte, binary.MaxVarintLen64)...)
		b = c.Snapshot(b)
		var n [binary.MaxVarintLen64]byte
		l := binary.PutUvarint(n[:], uint64(len(b)-at-binary.MaxVarintLen64))
		copy(b[at:], n[:l])
		b = append(b[:at+l], b[at+binary.MaxVarintLen64:]...)
	} else {
		b = binary.AppendUvarint(b, uint64(len(c.Agg)))
		b = append(b, c.Agg...)
	}
	clients := slices.Sorted(maps.Keys(c.Sessions))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		s := c.Sessions[id]
		b = appendString(b, id)
		b = append(b, s.Proto)
		b = binary.AppendUvarint(b, uint64(s.Expiry))
		b = appendString(b, s.Username)
		b = appendString(b, s.Listener)
	}
	clients = slices.Sorted(maps.Keys(c.Rings))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		r := c.Rings[id]
		b = appendString(b, id)
		b = binary.AppendUvarint(b, r.used)
		b = binary.AppendUvarint(b, uint64(len(r.ents)))
		for _, pid := range r.sortedEntries() {
			e := r.ents[pid]
			b = binary.AppendUvarint(b, uint64(pid))
			b = binary.LittleEndian.AppendUint64(b, e.hash)
			b = binary.AppendUvarint(b, e.seq)
		}
		b = binary.AppendUvarint(b, r.since)
	}
	clients = slices.Sorted(maps.Keys(c.AwaitRel))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		b = appendString(b, id)
		pids := slices.Sorted(maps.Keys(c.AwaitRel[id]))
		b = binary.AppendUvarint(b, uint64(len(pids)))
		for _, pid := range pids {
			b = binary.AppendUvarint(b, uint64(pid))
		}
	}
	clients = slices.Sorted(maps.Keys(c.Subs))
	b = binary.AppendUvarint(b, uint64(len(clients)))
	for _, id := range clients {
		b = appendString(b, id)
		filters := slices.Sorted(maps.Keys(c.Subs[id]))
		b = binary.AppendUvarint(b, uint64(len(filters)))
		for _, f := range filters {
			s := c.Subs[id][f]
			b = appendString(b, f)
			b = append(b, s.flags())
			b = binary.AppendUvarint(b, uint64(s.Identifier))
		}
	}
	tl := c.Time
	b = appendString(b, tl.Boot)
	var flags byte
	if tl.Synchronized {
		flags |= 1
	}
	if tl.HasMono {
		flags |= 2
	}
	b = append(b, flags)
	for _, v := range [...]int64{tl.Wall, tl.Mono, tl.Elapsed, tl.Offset} {
		b = binary.AppendVarint(b, v)
	}
	h := c.Hold
	for _, v := range [...]uint64{h.Start, h.Records, h.Readings} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendVarint(b, h.Bytes)
	b = binary.AppendVarint(b, h.Since)
	b = binary.AppendUvarint(b, h.Rebased)
	b = binary.AppendUvarint(b, h.Unverified)
	if len(c.Sparkplug) > 0 {
		b = append(b, sectionSparkplug)
		b = binary.AppendUvarint(b, uint64(len(c.Sparkplug)))
		b = append(b, c.Sparkplug...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errCheckpoint = errors.New("damaged checkpoint")

// checkpointBody checks a checkpoint's header and checksum and returns
// what follows the version byte, up to the checksum.
func checkpointBody(b []byte) ([]byte, error) {
	if len(b) < len(checkpointMagic)+1+4 || string(b[:4]) != checkpointMagic {
		return nil, fmt.Errorf("%w: no header", errCheckpoint)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch", errCheckpoint)
	}
	version := body[4]
	if version < 1 || version > checkpointVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", errCheckpoint, body[4], checkpointVersion)
	}
	return body[5:], nil
}

// checkpointSeq checks a checkpoint's header and checksum and returns its
// sequence, without decoding the rest.
func checkpointSeq(b []byte) (uint64, error) {
	body, err := checkpointBody(b)
	if err != nil {
		return 0, err
	}
	seq, n := binary.Uvarint(body)
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad field", errCheckpoint)
	}
	return seq, nil
}

// DecodeCheckpoint decodes a checkpoint; one that fails its checksum or
// is not exactly one well-formed checkpoint is an error.
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	body, err := checkpointBody(b)
	if err != nil {
		return nil, err
	}
	version := b[4] // checkpointBody checked it
	r := reader{b: body, ok: true}
	c := &Checkpoint{Sessions: map[string]Session{}, Rings: map[string]*Ring{}, AwaitRel: PIDSets{}, Subs: map[string]map[string]Subscription{}}
	c.Seq = r.uvarint()
	c.Clock = r.varint()
	c.Agg = r.bytes()
	n := r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		var s Session
		s.Proto = r.byte()
		s.Expiry = uint32(r.uvarint())
		s.Username = string(r.bytes())
		s.Listener = string(r.bytes())
		c.Sessions[id] = s
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		rg := &Ring{used: r.uvarint()}
		m := r.uvarint()
		if m > uint64(len(r.b)) {
			r.ok = false
			break
		}
		rg.ents = make(map[uint16]dupEntry, m)
		for j := uint64(0); r.ok && j < m; j++ {
			pid := r.uvarint()
			if len(r.b) < 8 || pid > 0xffff {
				r.ok = false
				break
			}
			// Before version 3, entries of the client's latest
			// publications, oldest first, without their sequence: taken
			// as of the latest, so that only a receipt after it ends them.
			e := dupEntry{hash: binary.LittleEndian.Uint64(r.b) & hashMask, seq: rg.used}
			r.b = r.b[8:]
			if version >= 3 {
				e.seq = r.uvarint()
			}
			rg.ents[uint16(pid)] = e
		}
		if version >= 3 {
			rg.since = r.uvarint()
		}
		c.Rings[id] = rg
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		m := r.uvarint()
		for j := uint64(0); r.ok && j < m; j++ {
			c.AwaitRel.Add(id, uint16(r.uvarint()))
		}
	}
	n = r.uvarint()
	for i := uint64(0); r.ok && i < n; i++ {
		id := string(r.bytes())
		m := r.uvarint()
		c.Subs[id] = map[string]Subscription{}
		for j := uint64(0); r.ok && j < m; j++ {
			f := string(r.bytes())
			flags := r.byte()
			c.Subs[id][f] = subscriptionOf(flags, int(r.uvarint()))
		}
	}
	if version >= 2 {
		tl := &c.Time
		tl.Valid = true
		tl.Boot = string(r.bytes())
		flags := r.byte()
		tl.Synchronized, tl.HasMono = flags&1 != 0, flags&2 != 0
		if flags&^3 != 0 {
			r.ok = false
		}
		tl.Wall, tl.Mono, tl.Elapsed, tl.Offset = r.varint(), r.varint(), r.varint(), r.varint()
		h := &c.Hold
		h.Start, h.Records, h.Readings = r.uvarint(), r.uvarint(), r.uvarint()
		h.Bytes, h.Since = r.varint(), r.varint()
		h.Rebased, h.Unverified = r.uvarint(), r.uvarint()
	}
	for r.ok && len(r.b) > 0 {
		tag := r.byte()
		if sec := r.bytes(); tag == sectionSparkplug {
			c.Sparkplug = sec
		}
	}
	if !r.ok || len(r.b) != 0 {
		return nil, fmt.Errorf("%w: bad field", errCheckpoint)
	}
	return c, nil
}
