package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// TestRefusalCostsABcrypt: an unknown username costs the same bcrypt
// comparison as a known one with a wrong password, against a dummy hash of
// the users' cost, so that the time of a refusal does not tell which
// usernames exist. Asserted by what runs, not by timing.
func TestRefusalCostsABcrypt(t *testing.T) {
	const cost = bcrypt.MinCost + 1
	hash, err := bcrypt.GenerateFromPassword([]byte("pw-1"), cost)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAuthenticator(Users{"dev-1": hash}, false, 1)
	type call struct {
		hash []byte
		err  error
	}
	var calls []call
	a.compare = func(h, pw []byte) error {
		err := bcrypt.CompareHashAndPassword(h, pw)
		calls = append(calls, call{h, err})
		return err
	}
	for _, tc := range []struct {
		name, user, pass string
		want             bool
	}{
		{"known user, wrong password", "dev-1", "pw-2", false},
		{"unknown user", "dev-9", "pw-1", false},
		{"unknown user, empty password", "dev-9", "", false},
		{"known user, right password", "dev-1", "pw-1", true},
	} {
		calls = nil
		if got, err := a.Check(tc.user, []byte(tc.pass)); got != tc.want || err != nil {
			t.Errorf("%s: check = %v, %v; want %v", tc.name, got, err, tc.want)
		}
		if len(calls) != 1 {
			t.Errorf("%s: %d bcrypt comparisons, want 1", tc.name, len(calls))
			continue
		}
		c := calls[0]
		if got, err := bcrypt.Cost(c.hash); err != nil || got != cost {
			t.Errorf("%s: compared against a hash of cost %d (%v), want %d", tc.name, got, err, cost)
		}
		// A malformed dummy would fail at once, before any hashing.
		if want := bcrypt.ErrMismatchedHashAndPassword; !tc.want && !errors.Is(c.err, want) {
			t.Errorf("%s: comparison said %v, want %v", tc.name, c.err, want)
		}
	}
	// Without users, an unknown user still costs a comparison, at
	// bcrypt's default cost (what edgegate passwd writes).
	a.SetUsers(Users{})
	calls = nil
	if ok, _ := a.Check("dev-1", []byte("pw-1")); ok || len(calls) != 1 {
		t.Fatalf("no users: %d comparisons, want 1", len(calls))
	}
	if got, _ := bcrypt.Cost(calls[0].hash); got != bcrypt.DefaultCost {
		t.Errorf("no users: dummy hash of cost %d, want %d", got, bcrypt.DefaultCost)
	}
}

// TestUpdateUsersFileChecksBeforeReplacing: a change that leaves a file
// the gateway cannot load (here a line another tool wrote) is refused
// before the file is replaced: the running gateway's next reload, and the
// next start, still see the file as it was.
func TestUpdateUsersFileChecksBeforeReplacing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users")
	old := "ops:not-a-bcrypt-hash\n"
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	hash := func() ([]byte, error) {
		return []byte("$2a$10$abcdefghijklmnopqrstuuM0XKfGrszEDAnwxF4UUvFNa/KdE3IPe"), nil
	}
	err := UpdateUsersFile(path, "dev-1", false, hash)
	if err == nil || !strings.Contains(err.Error(), "would not load") {
		t.Fatalf("UpdateUsersFile = %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(path); string(b) != old {
		t.Errorf("file replaced anyway: %q", b)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".users.tmp*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

// TestCheckSlots: with every slot taken, a wrong password and an unknown
// username alike wait SlotWait and are refused as busy without a
// comparison, while a cached password needs no slot; a slot freed is
// taken by a waiting check.
func TestCheckSlots(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw-1"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAuthenticator(Users{"dev-1": hash}, false, 1)
	a.wait = 50 * time.Millisecond
	if ok, err := a.Check("dev-1", []byte("pw-1")); !ok || err != nil {
		t.Fatalf("first check: %v, %v", ok, err)
	}
	var compared atomic.Int32
	a.compare = func(h, pw []byte) error {
		compared.Add(1)
		return bcrypt.CompareHashAndPassword(h, pw)
	}
	a.slots <- struct{}{} // a comparison that goes on
	for name, tc := range map[string]struct{ user, pass string }{
		"wrong password": {"dev-1", "pw-2"},
		"unknown user":   {"dev-9", "pw-1"},
	} {
		start := time.Now()
		ok, err := a.Check(tc.user, []byte(tc.pass))
		if ok || !errors.Is(err, ErrBusy) {
			t.Errorf("%s, no slot: %v, %v; want false, ErrBusy", name, ok, err)
		}
		if d := time.Since(start); d < a.wait {
			t.Errorf("%s, no slot: answered in %s, before the wait of %s", name, d, a.wait)
		}
	}
	if ok, err := a.Check("dev-1", []byte("pw-1")); !ok || err != nil {
		t.Errorf("cached password, no slot: %v, %v; want true", ok, err)
	}
	if n := compared.Load(); n != 0 {
		t.Errorf("%d comparisons without a slot", n)
	}
	a.wait = patience
	go func() {
		time.Sleep(20 * time.Millisecond)
		<-a.slots // the comparison ends
	}()
	if ok, err := a.Check("dev-1", []byte("pw-2")); ok || err != nil {
		t.Errorf("wrong password, a slot freed while waiting: %v, %v; want false, nil", ok, err)
	}
	if n := compared.Load(); n != 1 {
		t.Errorf("%d comparisons, want 1", n)
	}
}

const patience = 30 * time.Second
