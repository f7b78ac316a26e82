package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/term"

	"github.com/edgegate/edgegate/gateway/broker/auth"
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
	if err := auth.CheckUsername(user); err != nil {
		return usageError{fmt.Errorf("passwd: %w", err)}
	}
	var hash func() ([]byte, error)
	if !*del {
		hash = func() ([]byte, error) {
			pw, err := readPassword(stdin, stderr)
			if err != nil {
				return nil, err
			}
			h, err := bcrypt.GenerateFromPassword(pw, passwdCost)
			if err != nil {
				return nil, err
			}
			return h, nil
		}
	}
	if err := auth.UpdateUsersFile(path, user, *create, hash); err != nil {
		return fmt.Errorf("passwd: %w", err)
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
			return nil, fmt.Errorf("read password: %w", err)
		}
		fmt.Fprint(stderr, "Again: ")
		again, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		if err != nil {
			return nil, fmt.Errorf("read password: %w", err)
		}
		if !bytes.Equal(pw, again) {
			return nil, errors.New("the passwords differ")
		}
		return checkPassword(pw)
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return nil, fmt.Errorf("read password from standard input: %w", err)
	}
	return checkPassword([]byte(strings.TrimRight(line, "\r\n")))
}

func checkPassword(pw []byte) ([]byte, error) {
	switch {
	case len(pw) == 0:
		return nil, errors.New("empty password")
	case len(pw) > 72:
		return nil, errors.New("password longer than 72 bytes (bcrypt's limit)")
	}
	return pw, nil
}
