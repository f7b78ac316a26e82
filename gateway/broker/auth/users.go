package auth

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// The users file holds one "username:bcrypt-hash" per line, as
// `htpasswd -B` and `edgegate passwd` write it; blank lines and lines
// starting with # are ignored. LoadUsers reads it, UpdateUsersFile
// changes one user in it; this file is the format's one owner.

// Users maps usernames to bcrypt password hashes.
type Users map[string][]byte

// LoadUsers reads a users file.
func LoadUsers(path string) (Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open users file: %w", err)
	}
	defer f.Close()
	users := Users{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s:%d: want username:bcrypt-hash", path, n)
		}
		if !IdentityLevel(name) {
			return nil, fmt.Errorf("%s:%d: user %q: a username may not contain '/', '+' or '#' (it stands for a topic level in ACLs)", path, n, name)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("%s:%d: user %q: not a bcrypt hash (%v); create it with htpasswd -B or edgegate passwd", path, n, name, err)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("%s:%d: user %q appears twice", path, n, name)
		}
		users[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read users file %s: %w", path, err)
	}
	return users, nil
}

// Authenticator checks CONNECT credentials. A bcrypt comparison costs tens
// of milliseconds on a Pi; after one succeeds, a SHA-256 of the password is
// cached so that a reconnect storm of thousands of devices does not pin the
// CPU.
//
// A refusal costs the same whether the username exists or not: an unknown
// one is compared against a dummy hash of the users' bcrypt cost, so the
// time of an answer does not tell which usernames exist.
//
// Comparisons run in a bounded number of slots: without credentials, a few
// hosts sending wrong passwords would otherwise keep every core busy (the
// connection rate is per source address). A cache hit needs no slot.
type Authenticator struct {
	Anonymous bool
	// compare is bcrypt.CompareHashAndPassword (a test sees what runs).
	compare func(hash, password []byte) error
	slots   chan struct{} // one token per comparison running
	wait    time.Duration // for a slot, at most

	mu       sync.Mutex
	users    Users
	dummy    []byte // compared against for unknown usernames
	verified map[string][sha256.Size]byte
}

// ErrBusy is returned by Check when every slot stayed taken for SlotWait:
// the credentials were not checked.
var ErrBusy = errors.New("too many password checks at once")

// SlotWait is how long a check waits for a slot before ErrBusy: a Pi
// compares in 50–100 ms, so a check waits behind 10 or 20 others per slot
// at most, and a flood is answered within a second instead of queueing
// until the clients' connect timeouts.
const SlotWait = time.Second

// dummySalted is a bcrypt salt and hash (of no password anyone uses) that
// dummyHash puts behind a cost: comparing against it costs as much as
// against any hash of that cost, and never matches.
const dummySalted = "kixiSB/IeQcbChI37Bf.suBygAoVYvF9jq87/0.glMghbSYMqcqpu"

// dummyHash returns a hash to compare unknown usernames against: of the
// cost most of the users' hashes have (the higher on a tie), or bcrypt's
// default cost, which edgegate passwd writes, when there are no users.
func dummyHash(u Users) []byte {
	n := map[int]int{}
	cost := bcrypt.DefaultCost
	for _, h := range u {
		c, err := bcrypt.Cost(h)
		if err != nil {
			continue // LoadUsers refuses such a file
		}
		n[c]++
		if n[c] > n[cost] || n[c] == n[cost] && c > cost {
			cost = c
		}
	}
	return fmt.Appendf(nil, "$2a$%02d$%s", cost, dummySalted)
}

// SetUsers replaces the users (the file was reloaded).
func (a *Authenticator) SetUsers(u Users) {
	dummy := dummyHash(u)
	a.mu.Lock()
	a.users, a.dummy, a.verified = u, dummy, map[string][sha256.Size]byte{}
	a.mu.Unlock()
}

// NewAuthenticator checks credentials against users, with at most slots
// bcrypt comparisons at once (at least 1).
func NewAuthenticator(users Users, anonymous bool, slots int) *Authenticator {
	a := &Authenticator{Anonymous: anonymous, compare: bcrypt.CompareHashAndPassword,
		slots: make(chan struct{}, max(1, slots)), wait: SlotWait}
	a.SetUsers(users)
	return a
}

// Check verifies credentials; anonymous clients are decided by the hook
// before it gets here. It may be called concurrently. Credentials whose
// check succeeded before are found in the cache at once; any other check
// is one bcrypt comparison in a slot, or ErrBusy (and false) when no slot
// came free within SlotWait. An unknown username and a wrong password
// cost the same: the same wait, then one comparison of the same cost.
func (a *Authenticator) Check(user string, password []byte) (bool, error) {
	sum := sha256.Sum256(password)
	a.mu.Lock()
	hash, ok := a.users[user]
	cached, hit := a.verified[user]
	dummy := a.dummy
	a.mu.Unlock()
	if ok && hit && subtle.ConstantTimeCompare(cached[:], sum[:]) == 1 {
		return true, nil
	}
	if !a.acquire() {
		return false, ErrBusy
	}
	defer func() { <-a.slots }()
	if !ok {
		// Credentials were given, and they are wrong; take as long to
		// say so as for a known user.
		_ = a.compare(dummy, password)
		return false, nil
	}
	if a.compare(hash, password) != nil {
		return false, nil
	}
	a.mu.Lock()
	if string(a.users[user]) == string(hash) { // not replaced meanwhile
		a.verified[user] = sum
	}
	a.mu.Unlock()
	return true, nil
}

// acquire takes a slot, waiting at most a.wait.
func (a *Authenticator) acquire() bool {
	select {
	case a.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// CheckUsername says why name cannot be given to a new user: a username
// stands for a whole topic level in ACLs ({username}), and the file
// separates it from the hash with ':'. (LoadUsers accepts what other tools
// wrote as long as it is a topic level.)
func CheckUsername(name string) error {
	if name == "" || strings.ContainsAny(name, ":/+# \t") {
		return fmt.Errorf("username %q may not be empty or contain ':', '/', '+', '#' or spaces", name)
	}
	return nil
}

// UpdateUsersFile sets user's bcrypt hash, which hash returns once the
// file is read, in the users file at path, or deletes the user when hash
// is nil. With create, the file is started anew with only this user.
// Other lines, comments included, are kept. The file is replaced
// atomically, keeping its mode, owner and group, and must load afterwards.
func UpdateUsersFile(path, user string, create bool, hash func() ([]byte, error)) error {
	del := hash == nil
	var lines []string
	if !create {
		data, err := os.ReadFile(path)
		if err != nil && !(errors.Is(err, os.ErrNotExist) && !del) {
			return err
		}
		if len(data) > 0 {
			lines = strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		}
	}
	found := -1
	for i, l := range lines {
		if name, _, ok := strings.Cut(l, ":"); ok && name == user && !strings.HasPrefix(l, "#") {
			found = i
		}
	}
	switch {
	case del && found < 0:
		return fmt.Errorf("no user %q in %s", user, path)
	case del:
		lines = append(lines[:found], lines[found+1:]...)
	default:
		h, err := hash()
		if err != nil {
			return err
		}
		if found >= 0 {
			lines[found] = user + ":" + string(h)
		} else {
			lines = append(lines, user+":"+string(h))
		}
	}
	// What the gateway will read back must load: checked on the new file
	// before it replaces the old one.
	return writeFileAtomic(path, []byte(strings.Join(lines, "\n")+"\n"), func(tmp string) error {
		if _, err := LoadUsers(tmp); err != nil {
			return fmt.Errorf("the file would not load after the change (nothing was changed): %w", err)
		}
		return nil
	})
}

// writeFileAtomic replaces path with data, keeping path's mode, owner and
// group (new files: 0600): a reader sees the old file or the new one,
// never a part, and a service that could read it still can. check sees the
// new file before it replaces path, and can refuse it.
func writeFileAtomic(path string, data []byte, check func(tmp string) error) error {
	mode := os.FileMode(0o600)
	st, statErr := os.Stat(path)
	if statErr == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if statErr == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			if err := tmp.Chown(int(sys.Uid), int(sys.Gid)); err != nil && (int(sys.Uid) != os.Geteuid() || int(sys.Gid) != os.Getegid()) {
				tmp.Close()
				return fmt.Errorf("keep the owner of %s: %w", path, err)
			}
		}
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := check(tmp.Name()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// The rename is durable only once the directory is.
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// SetCompare replaces bcrypt.CompareHashAndPassword, which every check
// that is not a cache hit runs (tests count and slow the comparisons).
// Call it before the first Check.
func (a *Authenticator) SetCompare(f func(hash, password []byte) error) { a.compare = f }
