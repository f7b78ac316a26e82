package broker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
	hash := func() ([]byte, error) { return []byte("$2a$10$abcdefghijklmnopqrstuuM0XKfGrszEDAnwxF4UUvFNa/KdE3IPe"), nil }
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
