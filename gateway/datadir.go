package gateway

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/edgegate/edgegate/bridge/queue"
)

// LockDataDir takes an exclusive lock on <dir>/lock, so that a second
// gateway started on the same directory stops before it recovers (and
// truncates) files the first is writing. Close releases it.
func LockDataDir(dir string) (io.Closer, error) {
	if err := queue.MkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("gateway.data_dir: %w", err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("gateway.data_dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("gateway.data_dir %s is in use by another edgegate (pid %s); stop it or use another directory", dir, strings.TrimSpace(string(b)))
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f, nil
}
