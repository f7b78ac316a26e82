package ratelimit

import (
	"net/netip"
	"testing"
	"time"
)

// TestPerAddressKey: an IPv6 host routinely has a whole /64 (SLAAC,
// privacy addresses rotate within it), so its addresses share one bucket;
// IPv4 addresses, and IPv6 networks, have one each.
func TestPerAddressKey(t *testing.T) {
	for name, tc := range map[string]struct {
		a, b string
		same bool
	}{
		"ipv6 same /64":             {"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", true},
		"ipv6 other /64":            {"2001:db8:1:2::1", "2001:db8:1:3::1", false},
		"ipv6 link-local":           {"fe80::1", "fe80::2", true},
		"ipv4 other address":        {"192.0.2.1", "192.0.2.2", false},
		"ipv4 same address":         {"192.0.2.1", "192.0.2.1", true},
		"ipv4-mapped is ipv4":       {"::ffff:192.0.2.1", "192.0.2.1", true},
		"ipv4-mapped other address": {"::ffff:192.0.2.1", "::ffff:192.0.2.2", false},
	} {
		t.Run(name, func(t *testing.T) {
			ka, kb := Key(netip.MustParseAddr(tc.a)), Key(netip.MustParseAddr(tc.b))
			if (ka == kb) != tc.same {
				t.Errorf("Key(%s) = %v, Key(%s) = %v; same: want %v", tc.a, ka, tc.b, kb, tc.same)
			}
		})
	}
}

// TestPerAddressIPv6Network: a host that connects from a new address of
// its /64 each time is limited as one address.
func TestPerAddressIPv6Network(t *testing.T) {
	l := NewPerAddress(1, 5, []string{"2001:db8:ffff::/48"})
	now := time.Unix(1e9, 0)
	allowed := 0
	for i := range 50 {
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)})
		if l.Allow(netip.AddrPortFrom(a, 40000).String(), now) {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("50 connections from 50 addresses of one /64 at once: %d allowed, want the burst, 5", allowed)
	}
	if !l.Allow("[2001:db8:1:3::1]:40000", now) {
		t.Error("another /64 was refused")
	}
	for range 10 {
		if !l.Allow("[2001:db8:ffff::1]:40000", now) {
			t.Fatal("an exempt address was refused")
		}
	}
	if !l.Allow("192.0.2.1:1", now) || !l.Allow("192.0.2.2:1", now) {
		t.Error("IPv4 addresses of one /24 share a bucket")
	}
}

// TestTakeN: a burst passes at once; past it, the debt is paid at the
// rate, and an event larger than the burst goes through and is paid
// after.
func TestTakeN(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b Bucket
	const rate, burst = 1000, 2000 // bytes per second
	for i, step := range []struct {
		at   time.Duration
		n    float64
		wait time.Duration
	}{
		{0, 1500, 0},           // 500 left
		{0, 500, 0},            // 0 left
		{0, 1000, time.Second}, // 1000 in debt
		{time.Second, 500, 500 * time.Millisecond}, // paid, 500 in debt
		{10 * time.Second, 5000, 3 * time.Second},  // full (2000), 3000 in debt
		{13 * time.Second, 0, 0},                   // paid
		{15 * time.Second, 2000, 0},                // a full burst again
	} {
		if got := b.TakeN(t0.Add(step.at), step.n, rate, burst); got != step.wait {
			t.Errorf("step %d: TakeN(%v, %v) waits %v, want %v", i, step.at, step.n, got, step.wait)
		}
	}
}
