// Package ratelimit holds the token buckets of the gateway's limits: per
// client (publications) and per source address (connections).
package ratelimit

import (
	"net/netip"
	"sync"
	"time"
)

// Bucket allows rate events per second with bursts of burst.
type Bucket struct {
	tokens float64
	last   time.Time
}

// Take takes a token at now; if none is left it returns how long until one
// is.
func (b *Bucket) Take(now time.Time, rate float64, burst int) time.Duration {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else {
		b.tokens = min(float64(burst), b.tokens+now.Sub(b.last).Seconds()*rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) / rate * float64(time.Second))
}

// TakeN takes n tokens at now, into debt if there are not so many (n may
// be more than burst: a large event goes through at once and its cost is
// paid after), and returns how long until the debt is paid: 0 when there
// is none. A caller that waits that long before its next event keeps to
// rate.
func (b *Bucket) TakeN(now time.Time, n, rate float64, burst int) time.Duration {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else {
		b.tokens = min(float64(burst), b.tokens+now.Sub(b.last).Seconds()*rate)
	}
	b.last = now
	b.tokens -= n
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / rate * float64(time.Second))
}

// PerAddress limits new connections per source address (an IPv6 /64:
// see Key); addresses in the exempt prefixes are never limited.
type PerAddress struct {
	rate   float64
	burst  int
	exempt []netip.Prefix

	mu      sync.Mutex
	buckets map[netip.Addr]*Bucket
	swept   time.Time
}

// Key returns the bucket an address's connections count against: an IPv4
// address itself, and an IPv6 address's /64. An IPv6 host routinely holds
// a whole /64 (SLAAC; privacy addresses rotate within it, RFC 8981) and can
// connect from a new address each time, so its /64 is what one IPv4
// address is. IPv4 is not keyed by its /24 too: a site's devices usually
// share the gateway's /24, and a bucket for it would throttle the whole
// fleet reconnecting after a restart; bcrypt's CPU, which the limit once
// was the only guard of, is bounded by the authenticator's slots.
func Key(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is4() {
		return a
	}
	p, _ := a.Prefix(64) // cannot fail for IPv6
	return p.Addr()
}

// NewPerAddress allows rate new connections per second per address, with
// bursts of burst; exempt are CIDR prefixes (validated by the caller).
func NewPerAddress(rate float64, burst int, exempt []string) *PerAddress {
	l := &PerAddress{rate: rate, burst: burst, buckets: map[netip.Addr]*Bucket{}}
	for _, e := range exempt {
		if p, err := netip.ParsePrefix(e); err == nil { // validated with the configuration
			l.exempt = append(l.exempt, p)
		}
	}
	return l
}

// Allow reports whether a connection from remote (host:port) may proceed.
// Exemptions apply to the address itself, the rate to its Key.
func (l *PerAddress) Allow(remote string, now time.Time) bool {
	if l.rate <= 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return true // not an IP socket (a test pipe)
	}
	addr := ap.Addr().Unmap()
	for _, p := range l.exempt {
		if p.Contains(addr) {
			return true
		}
	}
	addr = Key(addr)
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		// Forget addresses whose bucket has refilled: the map stays as
		// large as the set of recent sources.
		full := time.Duration(float64(l.burst)/l.rate*float64(time.Second)) + time.Second
		for a, b := range l.buckets {
			if now.Sub(b.last) > full {
				delete(l.buckets, a)
			}
		}
		l.swept = now
	}
	b := l.buckets[addr]
	if b == nil {
		b = &Bucket{}
		l.buckets[addr] = b
	}
	return b.Take(now, l.rate, l.burst) == 0
}
