package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100
// on every Linux architecture Go supports.
const userHZ = 100

// stopWait bounds how long a process may take to exit after SIGTERM
// (edgegate closes its windows and delivers them within its 5 s grace).
const stopWait = time.Minute

// proc is a child process whose output goes to a log file; the goroutine
// that waits for it is its own and ends when the process does.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// startProc starts argv in dir with its output in dir/name.log. The child
// is killed if this process dies first.
func startProc(dir, name string, argv ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits for the exit, killing the process after
// stopWait. It returns the CPU time the process used in its life (the
// kernel's rusage: utime + stime).
func (p *proc) stop() (time.Duration, error) {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(stopWait):
			p.cmd.Process.Kill()
			<-p.exited
			return 0, fmt.Errorf("%s did not exit within %s of SIGTERM (log: %s)", p.name, stopWait, p.log)
		}
	}
	if p.err != nil {
		return 0, fmt.Errorf("%s: %w (log: %s)", p.name, p.err, p.log)
	}
	ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0, fmt.Errorf("%s: no rusage", p.name)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// kill ends the process if it still runs; for error paths.
func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// alive returns an error naming the log if the process has exited.
func (p *proc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited: %v (log: %s)", p.name, p.err, p.log)
	default:
		return nil
	}
}

// cpuTime returns the CPU time pid has used so far: utime + stime from
// /proc/PID/stat, to 1/USER_HZ.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

// parseStat reads utime and stime (fields 14 and 15, proc(5)) of a
// /proc/PID/stat line; the command name before them may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the name, want 13 or more", len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc stat: %w", err)
	}
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// memory returns VmRSS (resident now) and VmHWM (the peak) of pid, in
// bytes.
func memory(pid int) (rss, hwm uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatus(string(b))
}

func parseStatus(s string) (rss, hwm uint64, err error) {
	var found int
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		var dst *uint64
		switch f[0] {
		case "VmRSS:":
			dst = &rss
		case "VmHWM:":
			dst = &hwm
		default:
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc status %s: %w", f[0], err)
		}
		*dst = v * 1024
		found++
	}
	if found != 2 {
		return 0, 0, errors.New("/proc status: no VmRSS and VmHWM")
	}
	return rss, hwm, nil
}

// freePort returns a loopback port nobody listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitListening waits until addr accepts TCP connections, or p exits, or
// limit passes.
func waitListening(p *proc, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if err := p.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %s (log: %s)", p.name, addr, limit, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLine waits until p's log holds a line starting with prefix and
// returns the rest of it.
func waitLine(p *proc, prefix string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		b, _ := os.ReadFile(p.log)
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, prefix); ok && strings.HasSuffix(line, "\n") {
				return strings.TrimSpace(rest), nil
			}
		}
		if err := p.alive(); err != nil {
			return "", err
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not say %q within %s (log: %s)", p.name, prefix, limit, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
