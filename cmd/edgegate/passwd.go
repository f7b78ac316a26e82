package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/term"

	"github.com/edgegate/edgegate/gateway"
)

// passwdCost is the bcrypt cost of new hashes: about 50 ms on a Pi 4 per
// first login of a device (the gateway caches a verified password, so
// reconnects do not pay it again).
const passwdCost = 10

// cmdPasswd adds, updates or deletes a user in a users file, as
// mosquitto_passwd does. The password is read from the terminal without
// echo (twice), or as one line from standard input when it is not a
// terminal.
func cmdPasswd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flagSet("passwd", stderr)
	del := fs.Bool("D", false, "delete the user")
	create := fs.Bool("c", false, "create the file (or overwrite it) with only this user")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Usage: edgegate passwd [-c] [-D] FILE USERNAME

Adds USERNAME to the users file FILE with a bcrypt hash of a password
read from the terminal (or one line of standard input), or updates it;
-D deletes it. A running gateway reads the file again on SIGHUP
(systemctl reload edgegate).`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return usageError{errors.New("passwd: want FILE and USERNAME")}
	}
	path, user := fs.Arg(0), fs.Arg(1)
	if user == "" || strings.ContainsAny(user, ":/+# \t") {
		return usageError{fmt.Errorf("passwd: username %q may not be empty or contain ':', '/', '+', '#' or spaces", user)}
	}
	var lines []string
	if !*create {
		data, err := os.ReadFile(path)
		if err != nil && !(errors.Is(err, os.ErrNotExist) && !*del) {
			return fmt.Errorf("passwd: %w", err)
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
	if *del {
		if found < 0 {
			return fmt.Errorf("passwd: no user %q in %s", user, path)
		}
		lines = append(lines[:found], lines[found+1:]...)
	} else {
		pw, err := readPassword(stdin, stderr)
		if err != nil {
			return err
		}
		hash, err := bcrypt.GenerateFromPassword(pw, passwdCost)
		if err != nil {
			return fmt.Errorf("passwd: %w", err)
		}
		entry := user + ":" + string(hash)
		if found >= 0 {
			lines[found] = entry
		} else {
			lines = append(lines, entry)
		}
	}
	if err := writeFileAtomic(path, []byte(strings.Join(lines, "\n")+"\n")); err != nil {
		return fmt.Errorf("passwd: %w", err)
	}
	// What the gateway will read back must load.
	if _, err := gateway.LoadUsers(path); err != nil {
		return fmt.Errorf("passwd: the file does not load after the change: %w", err)
	}
	verb := map[bool]string{true: "deleted", false: "set"}[*del]
	fmt.Fprintf(stdout, "%s: user %s %s\n", path, user, verb)
	return nil
}

func readPassword(stdin io.Reader, stderr io.Writer) ([]byte, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(stderr, "Password: ")
		pw, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return nil, fmt.Errorf("passwd: read password: %w", err)
		}
		fmt.Fprint(stderr, "Again: ")
		again, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return nil, fmt.Errorf("passwd: read password: %w", err)
		}
		if !bytes.Equal(pw, again) {
			return nil, errors.New("passwd: the passwords differ")
		}
		return checkPassword(pw)
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return nil, fmt.Errorf("passwd: read password from standard input: %w", err)
	}
	return checkPassword([]byte(strings.TrimRight(line, "\r\n")))
}

func checkPassword(pw []byte) ([]byte, error) {
	switch {
	case len(pw) == 0:
		return nil, errors.New("passwd: empty password")
	case len(pw) > 72:
		return nil, errors.New("passwd: password longer than 72 bytes (bcrypt's limit)")
	}
	return pw, nil
}

// writeFileAtomic replaces path with data, keeping path's mode, owner and
// group (new files: 0600): a reader sees the old file or the new one,
// never a part, and a service that could read it still can.
func writeFileAtomic(path string, data []byte) error {
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
	return os.Rename(tmp.Name(), path)
}
