package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgegate/edgegate/gateway/broker/auth"
	"golang.org/x/crypto/bcrypt"
)

func TestPasswd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users")
	run := func(stdin string, args ...string) error {
		var out, errb bytes.Buffer
		return cmdPasswd(args, strings.NewReader(stdin), &out, &errb)
	}
	check := func(user, pw string, want bool) {
		t.Helper()
		users, err := auth.LoadUsers(path)
		if err != nil {
			t.Fatal(err)
		}
		h, ok := users[user]
		if got := ok && bcrypt.CompareHashAndPassword(h, []byte(pw)) == nil; got != want {
			t.Errorf("%s/%s accepted = %v, want %v", user, pw, got, want)
		}
	}
	if err := run("pw-1\n", path, "dev-1"); err != nil {
		t.Fatal(err)
	}
	if err := run("pw-2", path, "dev-2"); err != nil { // no newline at EOF
		t.Fatal(err)
	}
	check("dev-1", "pw-1", true)
	check("dev-2", "pw-2", true)
	if err := run("new\n", path, "dev-1"); err != nil {
		t.Fatal(err)
	}
	check("dev-1", "pw-1", false)
	check("dev-1", "new", true)
	check("dev-2", "pw-2", true)
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	// An update keeps the mode and group a service reads the file by.
	os.Chmod(path, 0o640)
	if os.Geteuid() == 0 {
		os.Chown(path, 0, 12345)
	}
	if err := run("newer\n", path, "dev-1"); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 || (os.Geteuid() == 0 && st.Sys().(*syscall.Stat_t).Gid != 12345) {
		t.Errorf("after an update: mode %v, group %d; want 0640 and the group it had", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid)
	}
	check("dev-1", "newer", true)
	if err := run("new\n", path, "dev-1"); err != nil {
		t.Fatal(err)
	}
	if err := run("", "-D", path, "dev-2"); err != nil {
		t.Fatal(err)
	}
	check("dev-2", "pw-2", false)
	check("dev-1", "new", true)
	if err := run("", "-D", path, "dev-2"); err == nil || !strings.Contains(err.Error(), `no user "dev-2"`) {
		t.Errorf("deleting a missing user: %v", err)
	}
	if err := run("x\n", "-c", path, "dev-9"); err != nil {
		t.Fatal(err)
	}
	check("dev-1", "new", false)
	check("dev-9", "x", true)
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"pw\n", []string{path, "a/b"}, "may not be empty or contain"},
		{"pw\n", []string{path, "dev+"}, "may not be empty or contain"},
		{"\n", []string{path, "dev-3"}, "empty password"},
		{"", []string{path, "dev-3"}, "read password from standard input"},
		{strings.Repeat("x", 73) + "\n", []string{path, "dev-3"}, "longer than 72 bytes"},
		{"pw\n", []string{path}, "want FILE and USERNAME"},
	} {
		if err := run(tc.stdin, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("passwd %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestCheckWarns(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte("mqtt: {listen: '0.0.0.0:1883', allow_anonymous: true}\nkafka: {brokers: ['k:9092']}\n"), 0o600)
	var out, errb bytes.Buffer
	if code := runMain(t.Context(), []string{"check", "--config", cfg}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"warning: mqtt.listen: 0.0.0.0:1883 is reachable from the network without TLS", "warning: mqtt.allow_anonymous:"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr %q lacks %q", errb.String(), want)
		}
	}
}
