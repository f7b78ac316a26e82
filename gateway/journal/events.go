package journal

import (
	"encoding/binary"
	"errors"
)

// The ingest journal is a queue.Log in <data_dir>/ingest holding every
// event that changes the gateway's state, in the order it is applied:
// publications, the idle-close tick, the shutdown flush and MQTT sessions
// beginning and ending. Events are applied to the aggregator only after
// they are durable, so replaying the journal from a checkpoint rebuilds
// exactly the state, and the outputs, that the first run had. JOURNAL.md
// gives the record layout.
const (
	KindPublish      byte = 'P'
	KindTick         byte = 'T'
	KindFlush        byte = 'F'
	KindSessionStart byte = 'S'
	KindSessionEnd   byte = 'E'
	KindPubrel       byte = 'R'
	KindSubscribe    byte = 'B'
	KindUnsubscribe  byte = 'N'
	// KindClock: the boot the monotonic times that follow count from, and
	// whether the wall clock was synchronized (ClockState).
	KindClock byte = 'C'
	// KindReceived: a client has received the acknowledgements of its
	// publications journaled up to a sequence, and will not resend them.
	KindReceived byte = 'K'
)

// monoBit in a record's kind byte: a uvarint monotonic time (ns since
// boot) follows its wall time. Records without it (journals written before
// it) have no monotonic time.
const monoBit = 0x80

// Publication flags in a publish event.
const (
	FlagQoSMask = 0x03
	FlagDup     = 0x04
	FlagRetain  = 0x08
	// FlagDevice: the record names, after the client id, the one device
	// the publisher may publish readings of (a client of the device role:
	// its identity). Records without it (older ones too) name none.
	FlagDevice = 0x10
	// FlagLocal: the gateway made the publication itself (its own
	// sensors, journal.Local): the times in it are the gateway's clock.
	FlagLocal = 0x20
)

// Event is a decoded journal record. Byte slices alias the record.
type Event struct {
	Kind byte
	At   int64 // wall clock, Unix nanoseconds
	// Mono is the monotonic time (ns since boot, CLOCK_BOOTTIME) when
	// HasMono: records journaled without a monotonic clock, and those of
	// older journals, have none.
	Mono    int64
	HasMono bool
	Clock   ClockState // KindClock
	Flags   byte
	PID     uint16
	Client  []byte
	Device  []byte // with FlagDevice: the only device its readings may name
	Topic   []byte
	Payload []byte
	Session Session
	Sub     Subscription
	// Upto is, for KindReceived, the journal sequence up to which the
	// client has received its acknowledgements.
	Upto uint64
}

// Session is what the journal keeps of a persistent MQTT session, enough
// for mochi to restore it (so that CONNACK says the session is present).
type Session struct {
	Proto    byte
	Expiry   uint32 // session expiry interval, seconds
	Username string
	Listener string
}

// ClockState is what a KindClock event records: the boot the monotonic
// times of the events after it count from, and the wall clock's
// synchronization then.
type ClockState struct {
	Boot         string
	Synchronized bool
	MaxError     int64 // the kernel's error bound, µs; 0 when unknown
}

var errEvent = errors.New("undecodable journal record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendPublish appends a publish event to b.
func AppendPublish(b []byte, at int64, flags byte, pid uint16, client, topic string, payload []byte) []byte {
	return AppendPublishAs(b, at, flags&^FlagDevice, pid, client, "", topic, payload)
}

// AppendPublishAs appends a publish event to b whose readings may name
// device only (none: any), with FlagDevice.
func AppendPublishAs(b []byte, at int64, flags byte, pid uint16, client, device, topic string, payload []byte) []byte {
	if device != "" {
		flags |= FlagDevice
	}
	b = append(b, KindPublish)
	b = binary.AppendVarint(b, at)
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(pid))
	b = appendString(b, client)
	if device != "" {
		b = appendString(b, device)
	}
	b = appendString(b, topic)
	return append(b, payload...)
}

func appendClock(b []byte, kind byte, at int64) []byte {
	b = append(b, kind)
	return binary.AppendVarint(b, at)
}

// stampMono marks the record that begins at b[start] as carrying the
// monotonic time mono (its kind's monoBit, the uvarint after its wall
// time).
func stampMono(b []byte, start int, mono int64) []byte {
	b[start] |= monoBit
	_, n := binary.Varint(b[start+1:])
	at := start + 1 + n
	var tmp [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(tmp[:], uint64(mono))
	b = append(b, tmp[:l]...)
	copy(b[at+l:], b[at:len(b)-l])
	copy(b[at:], tmp[:l])
	return b
}

func appendClockState(b []byte, at int64, c ClockState) []byte {
	b = appendClock(b, KindClock, at)
	b = appendString(b, c.Boot)
	var flags byte
	if c.Synchronized {
		flags |= 1
	}
	b = append(b, flags)
	return binary.AppendUvarint(b, uint64(max(0, c.MaxError)))
}

func appendSessionStart(b []byte, at int64, client string, s Session) []byte {
	b = appendClock(b, KindSessionStart, at)
	b = appendString(b, client)
	b = append(b, s.Proto)
	b = binary.AppendUvarint(b, uint64(s.Expiry))
	b = appendString(b, s.Username)
	return appendString(b, s.Listener)
}

func appendSessionEnd(b []byte, at int64, client string) []byte {
	b = appendClock(b, KindSessionEnd, at)
	return appendString(b, client)
}

// Subscription is what the journal keeps of a persistent session's
// subscription (mochi's storage.Subscription, without the id).
type Subscription struct {
	QoS, RetainHandling        byte
	NoLocal, RetainAsPublished bool
	Identifier                 int
}

func (s Subscription) flags() byte {
	f := s.QoS&3 | s.RetainHandling&3<<2
	if s.NoLocal {
		f |= 1 << 4
	}
	if s.RetainAsPublished {
		f |= 1 << 5
	}
	return f
}

func subscriptionOf(flags byte, identifier int) Subscription {
	return Subscription{QoS: flags & 3, RetainHandling: flags >> 2 & 3, NoLocal: flags&(1<<4) != 0, RetainAsPublished: flags&(1<<5) != 0, Identifier: identifier}
}

func appendSubscribe(b []byte, at int64, client, filter string, s Subscription) []byte {
	b = appendClock(b, KindSubscribe, at)
	b = appendString(b, client)
	b = appendString(b, filter)
	b = append(b, s.flags())
	return binary.AppendUvarint(b, uint64(s.Identifier))
}

func appendUnsubscribe(b []byte, at int64, client, filter string) []byte {
	b = appendClock(b, KindUnsubscribe, at)
	b = appendString(b, client)
	return appendString(b, filter)
}

func appendReceived(b []byte, at int64, client string, upto uint64) []byte {
	b = appendClock(b, KindReceived, at)
	b = appendString(b, client)
	return binary.AppendUvarint(b, upto)
}

func appendPubrel(b []byte, at int64, client string, pid uint16) []byte {
	b = appendClock(b, KindPubrel, at)
	b = appendString(b, client)
	return binary.AppendUvarint(b, uint64(pid))
}

// reader decodes the fields of one record.
type reader struct {
	b  []byte
	ok bool
}

func (r *reader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) varint() int64 {
	v, k := binary.Varint(r.b)
	if k <= 0 {
		r.ok = false
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.ok = false
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if !r.ok || n > uint64(len(r.b)) {
		r.ok = false
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

// DecodeEvent decodes one journal record; byte slices of the event alias
// rec. A record that is not exactly one well-formed event is errEvent.
func DecodeEvent(rec []byte) (Event, error) {
	r := reader{b: rec, ok: true}
	e := Event{Kind: r.byte()}
	e.At = r.varint()
	if e.Kind&monoBit != 0 {
		e.Kind &^= monoBit
		mono := r.uvarint()
		if mono > 1<<63-1 {
			r.ok = false
		}
		e.Mono, e.HasMono = int64(mono), true
	}
	switch e.Kind {
	case KindPublish:
		e.Flags = r.byte()
		pid := r.uvarint()
		if pid > 0xffff {
			r.ok = false
		}
		e.PID = uint16(pid)
		e.Client = r.bytes()
		if e.Flags&FlagDevice != 0 {
			e.Device = r.bytes()
		}
		e.Topic = r.bytes()
		e.Payload = r.b
		r.b = nil
	case KindTick, KindFlush:
	case KindClock:
		e.Clock.Boot = string(r.bytes())
		flags := r.byte()
		e.Clock.Synchronized = flags&1 != 0
		maxErr := r.uvarint()
		if flags&^1 != 0 || maxErr > 1<<62 {
			r.ok = false
		}
		e.Clock.MaxError = int64(maxErr)
	case KindSessionStart:
		e.Client = r.bytes()
		e.Session.Proto = r.byte()
		exp := r.uvarint()
		if exp > 1<<32-1 {
			r.ok = false
		}
		e.Session.Expiry = uint32(exp)
		e.Session.Username = string(r.bytes())
		e.Session.Listener = string(r.bytes())
	case KindSessionEnd:
		e.Client = r.bytes()
	case KindSubscribe:
		e.Client = r.bytes()
		e.Topic = r.bytes()
		flags := r.byte()
		id := r.uvarint()
		if id > 1<<28 {
			r.ok = false
		}
		e.Sub = subscriptionOf(flags, int(id))
	case KindUnsubscribe:
		e.Client = r.bytes()
		e.Topic = r.bytes()
	case KindReceived:
		e.Client = r.bytes()
		e.Upto = r.uvarint()
	case KindPubrel:
		e.Client = r.bytes()
		pid := r.uvarint()
		if pid > 0xffff {
			r.ok = false
		}
		e.PID = uint16(pid)
	default:
		r.ok = false
	}
	if !r.ok || len(r.b) != 0 {
		return Event{}, errEvent
	}
	return e, nil
}
