package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// connectWait bounds how long a load waits for its devices to connect.
const connectWait = 2 * time.Minute

// loadSpec is a load edgesim offers: devices × metrics readings, each
// device sampling rate times a second (one reading per metric each time),
// bare payloads at QoS 1; for a fixed number of readings or a duration.
type loadSpec struct {
	devices, metrics int
	rate             float64
	readings         int           // 0: run for duration
	duration         time.Duration // the run's length, or with readings its limit
}

// offered is the readings per second asked for.
func (l loadSpec) offered() float64 { return float64(l.devices*l.metrics) * l.rate }

func (l loadSpec) String() string {
	s := fmt.Sprintf("%s devices × %d metrics × %s/s", thousands(float64(l.devices)), l.metrics, strconv.FormatFloat(l.rate, 'g', -1, 64))
	if l.readings > 0 {
		return s + ", " + thousands(float64(l.readings)) + " readings"
	}
	return s + ", " + l.duration.String()
}

func (l loadSpec) args(addr string) []string {
	a := []string{"run", "--addr", addr, "--devices", strconv.Itoa(l.devices), "--metrics", strconv.Itoa(l.metrics),
		"--rate", strconv.FormatFloat(l.rate, 'g', -1, 64), "--qos", "1", "--form", "bare", "--hold", "--duration", l.duration.String()}
	if l.readings > 0 {
		a = append(a, "--readings", strconv.Itoa(l.readings))
	}
	return a
}

// load is an edgesim process holding its fleet until start.
type load struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	connected chan struct{}
	read      chan struct{} // closed when stdout is read to its end

	mu  sync.Mutex
	out strings.Builder
}

// loadResult is what edgesim's summary table reports.
type loadResult struct {
	sent, acked, errors uint64
	rate                float64 // readings sent per second
	p50, p99            float64 // PUBACK latency, ms
}

// startLoad starts edgesim against addr and waits until every device is
// connected (the fleet then idles until start).
func startLoad(ctx context.Context, edgesim, addr string, l loadSpec) (*load, error) {
	cmd := exec.Command(edgesim, l.args(addr)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ld := &load{cmd: cmd, stdin: stdin, connected: make(chan struct{}), read: make(chan struct{})}
	cmd.Stderr = &lockedWriter{ld}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start edgesim: %w", err)
	}
	go func() { // owned by ld: ends at the end of edgesim's output
		defer close(ld.read)
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			ld.mu.Lock()
			ld.out.WriteString(line + "\n")
			ld.mu.Unlock()
			if !seen && strings.HasPrefix(line, "connected ") {
				seen = true
				close(ld.connected)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ld.connected:
		return ld, nil
	case <-ld.read:
		_, err := ld.wait()
		return nil, fmt.Errorf("edgesim ended before its devices connected: %v\n%s", err, ld.output())
	case <-ctx.Done():
		ld.kill()
		return nil, ctx.Err()
	case <-time.After(connectWait):
		ld.kill()
		return nil, fmt.Errorf("edgesim's %d devices not connected within %s:\n%s", l.devices, connectWait, ld.output())
	}
}

type lockedWriter struct{ ld *load }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.ld.mu.Lock()
	defer w.ld.mu.Unlock()
	return w.ld.out.Write(p)
}

func (ld *load) output() string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.out.String()
}

// start releases the held fleet.
func (ld *load) start() error {
	_, err := io.WriteString(ld.stdin, "start\n")
	return err
}

// wait waits for edgesim's exit and reads its summary table.
func (ld *load) wait() (loadResult, error) {
	<-ld.read
	err := ld.cmd.Wait()
	out := ld.output()
	if err != nil {
		return loadResult{}, fmt.Errorf("edgesim: %w\n%s", err, out)
	}
	return parseTable(out)
}

func (ld *load) kill() {
	ld.cmd.Process.Kill()
	<-ld.read
	ld.cmd.Wait()
}

// parseTable reads the rows of edgesim run's summary table that the
// footprint needs.
func parseTable(out string) (loadResult, error) {
	rows := map[string]float64{}
	for line := range strings.Lines(out) {
		i := strings.LastIndexByte(strings.TrimRight(line, "\n "), ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i:]), 64)
		if err != nil {
			continue
		}
		rows[strings.TrimSpace(line[:i])] = v
	}
	var r loadResult
	for name, dst := range map[string]*float64{"readings sent/s": &r.rate, "PUBACK p50 ms": &r.p50, "PUBACK p99 ms": &r.p99} {
		v, ok := rows[name]
		if !ok {
			return r, fmt.Errorf("edgesim's table has no row %q:\n%s", name, out)
		}
		*dst = v
	}
	for name, dst := range map[string]*uint64{"readings sent": &r.sent, "readings acked": &r.acked, "errors": &r.errors} {
		v, ok := rows[name]
		if !ok {
			return r, fmt.Errorf("edgesim's table has no row %q:\n%s", name, out)
		}
		*dst = uint64(v)
	}
	return r, nil
}
