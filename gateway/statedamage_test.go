package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"periph.io/x/conn/v3/i2c/i2creg"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/bridge/queue"
	"github.com/edgegate/edgegate/cmd/edgegate/output"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
)

// The gateway under power loss and bit rot: a child process (this test
// binary, TestStateDamageChild) runs the gateway on a data directory, takes
// QoS 1 readings over TCP and is killed with SIGKILL after checkpoints;
// then state/state.db (or checkpoint.prev) is damaged, and the gateway,
// started again on it with the real forwarder and a Kafka-protocol broker,
// must start, and every acknowledged reading must be in the summaries
// exactly.

const stateChildEnv = "EDGEGATE_STATE_CHILD_DIR"

func stateConfig(t testing.TB, dir string) *configs.Config {
	t.Helper()
	c := configs.Default()
	c.Gateway.ID = "gw-it"
	c.Gateway.DataDir = dir
	c.MQTT.Listen = "127.0.0.1:0"
	c.MQTT.AllowAnonymous = true
	c.MQTT.ACL.AnonymousRole = "admin"
	c.Kafka.Brokers = []string{"127.0.0.1:9"}
	c.Aggregate.AllowedLateness = configs.Duration(time.Hour)
	// Windows close by their watermark only, and checkpoints are taken
	// when the test says: what is where is known exactly.
	c.Aggregate.IdleClose = configs.Duration(time.Hour)
	c.Storage.CheckpointInterval = configs.Duration(time.Hour)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestStateDamageChild runs a gateway on $EDGEGATE_STATE_CHILD_DIR with an
// outbound queue and no Kafka, prints its MQTT address, and answers
// "stats" and "checkpoint" on stdin until it is killed.
func TestStateDamageChild(t *testing.T) {
	dir := os.Getenv(stateChildEnv)
	if dir == "" {
		t.Skip("run by the state damage tests")
	}
	cfg := stateConfig(t, dir)
	down := func(context.Context) (bridge.Producer, error) { return nil, errors.New("no kafka") }
	fwd, err := bridge.NewForwarder(bridge.Options{Gateway: cfg.Gateway.ID, SummariesTopic: summariesTopic, DeadletterTopic: deadTopic,
		Logger: quietLog(), Dir: filepath.Join(dir, "outbound")}, down)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(cfg.GatewayOptions(i2creg.Open), output.Forwarder(fwd), quietLog(), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	fmt.Printf("ADDR %s\n", gw.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "checkpoint" {
			continue
		}
		// The tick that readings make due, now rather than after the
		// checkpoint; then checkpoints until one covers every event
		// journaled (every acknowledged publication is durable), so
		// that the journal segment ends at the checkpoint.
		err := gw.Tick()
		for err == nil {
			for gw.Stats().Journal.Applied+1 < gw.JournalLog().Stats().Durable {
				time.Sleep(2 * time.Millisecond)
			}
			if err = gw.WriteCheckpoint(); err == nil && gw.Stats().Journal.Checkpoint+1 == gw.JournalLog().Stats().Next {
				break
			}
		}
		if err != nil {
			fmt.Printf("ERR %v\n", err)
		} else {
			fmt.Printf("CP %d\n", gw.Stats().Journal.Checkpoint)
		}
	}
	cancel() // the parent is gone
	<-done
}

// gatewayChild is a gateway in a child process.
type gatewayChild struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	stderr *bytes.Buffer // the child's stderr, complete once it has been waited for
	stdout []string      // the rest of its stdout, complete once lines is closed
	addr   string
	once   sync.Once
}

func startChild(t *testing.T, dir string) (*gatewayChild, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestStateDamageChild$")
	cmd.Env = append(os.Environ(), stateChildEnv+"="+dir)
	c := &gatewayChild{t: t, cmd: cmd, lines: make(chan string, 16), stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "ADDR ") || strings.HasPrefix(l, "CP ") || strings.HasPrefix(l, "ERR ") {
				c.lines <- l
			} else {
				c.stdout = append(c.stdout, l)
			}
		}
	}()
	t.Cleanup(c.kill)
	addr, err := c.read("ADDR ")
	if err != nil {
		c.kill()
		return nil, fmt.Errorf("%w:\n%s\n%s", err, strings.Join(c.stdout, "\n"), c.stderr.String())
	}
	c.addr = addr
	return c, nil
}

// read returns the rest of the child's next line with prefix.
func (c *gatewayChild) read(prefix string) (string, error) {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.cmd.Wait()
				return "", fmt.Errorf("the gateway process ended (%v)", c.cmd.ProcessState)
			}
			if s, ok := strings.CutPrefix(l, prefix); ok {
				return s, nil
			}
			if strings.HasPrefix(l, "ERR ") {
				return "", errors.New(l)
			}
		case <-timeout:
			return "", fmt.Errorf("no %q from the gateway process", prefix)
		}
	}
}

func (c *gatewayChild) ask(cmd, prefix string) string {
	c.t.Helper()
	fmt.Fprintln(c.in, cmd)
	s, err := c.read(prefix)
	if err != nil {
		c.t.Fatalf("%s: %v", cmd, err)
	}
	return s
}

// checkpoint has the gateway write a checkpoint of everything it has
// acknowledged.
func (c *gatewayChild) checkpoint() {
	c.t.Helper()
	c.ask("checkpoint", "CP ")
}

// kill is the power cut (as far as the process goes): SIGKILL.
func (c *gatewayChild) kill() {
	c.once.Do(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
		for range c.lines {
		}
	})
}

// fleet publishes readings of ten devices, twenty metrics each, at QoS 1
// and records what it sent.
type fleet struct {
	base    time.Time
	truth   []sent
	sent    int // publications acknowledged
	clients []*rawClient
	pid     uint16
}

const fleetDevices, fleetMetrics = 10, 20

func (f *fleet) connect(t *testing.T, addr string) {
	f.clients = f.clients[:0]
	for d := range fleetDevices {
		c, _ := rawConnect(t, addr, fmt.Sprintf("dev-%02d", d), false)
		f.clients = append(f.clients, c)
	}
}

// at publishes one reading of every metric of devices devs, stamped base
// plus sec seconds, and returns once each is acknowledged.
func (f *fleet) at(sec int, devs ...int) {
	if len(devs) == 0 {
		for d := range fleetDevices {
			devs = append(devs, d)
		}
	}
	at := f.base.Add(time.Duration(sec) * time.Second)
	for _, d := range devs {
		dev := fmt.Sprintf("dev-%02d", d)
		var p strings.Builder
		fmt.Fprintf(&p, `{"t":%q`, at.Format(time.RFC3339Nano))
		for m := range fleetMetrics {
			v := float64(d*100_000+sec*100+m) / 4
			fmt.Fprintf(&p, `,"m%02d":%v`, m, v)
			f.truth = append(f.truth, sent{dev, fmt.Sprintf("m%02d", m), "", at, v})
		}
		p.WriteString("}")
		f.pid++
		if rc := f.clients[d].publish(f.pid, false, "sensors/"+dev, p.String()); rc != 0 {
			f.clients[d].t.Fatalf("%s: PUBACK reason %#x", dev, rc)
		}
		f.sent++
	}
}

// history runs the gateway in a child process through the phases, each a
// run killed at its end (after its checkpoints), on a new data directory.
func history(t *testing.T, f *fleet, runs ...func(c *gatewayChild)) string {
	dir := t.TempDir()
	for _, run := range runs {
		c, err := startChild(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		f.connect(t, c.addr)
		run(c)
		c.kill()
	}
	return dir
}

// copyTree copies the directory src to a new one.
func copyTree(t *testing.T, src string) string {
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o750)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o640)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// flipPage flips byte off of the first page of dir's state file that match
// selects, and returns that page.
func flipPage(t *testing.T, dir string, off int, match func(journal.StatePage) bool) journal.StatePage {
	t.Helper()
	path := filepath.Join(dir, "state", "state.db")
	pages, err := journal.StatePages(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if match(p) {
			flipAt(t, path, int64(p.ID)*int64(os.Getpagesize())+int64(off))
			return p
		}
	}
	t.Fatalf("no such page in %s", path)
	return journal.StatePage{}
}

func flipAt(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x5a
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// flipCheckpoint flips a byte in the middle of the checkpoint cp where the
// state file holds it.
func flipCheckpoint(t *testing.T, dir string, cp []byte) {
	t.Helper()
	path := filepath.Join(dir, "state", "state.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, cp)
	if i < 0 {
		t.Fatal("checkpoint not in the state file")
	}
	flipAt(t, path, int64(i+len(cp)/2))
}

// checkpoints returns the checkpoint in dir's state file and the one in
// checkpoint.prev.
func checkpoints(t *testing.T, dir string) (newest, previous []byte) {
	t.Helper()
	previous, err := os.ReadFile(filepath.Join(dir, "state", journal.PreviousName))
	if err != nil {
		t.Fatal(err)
	}
	db, err := journal.OpenStateDB(filepath.Join(copyTree(t, filepath.Join(dir, "state")), "state.db"), journal.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if newest, err = db.Checkpoint(); err != nil || newest == nil {
		t.Fatalf("checkpoint: %q, %v", newest, err)
	}
	return newest, previous
}

func kindOf(kind, bucket string, cur, prev bool) func(journal.StatePage) bool {
	return func(p journal.StatePage) bool {
		return p.Kind == kind && p.Bucket == bucket && p.Current == cur && p.Previous == prev
	}
}

// finish starts the gateway again on dir with the forwarder and a Kafka
// broker, has f publish with last (the readings after the restart), stops
// it, and checks that the highest revision of every window in Kafka has
// exactly the statistics of what f sent, less the readings after the
// restart for windows whose state was lost (lost says which): those must
// be dead letters, late_state_evicted (wantLost: some are).
func finish(t *testing.T, dir string, f *fleet, last func(*fleet), lost func(dev, metric string, start time.Time) bool, wantLost bool) gateway.Stats {
	t.Helper()
	// A first start in a child process on a copy: a crash is a failure
	// of this test, not of the test binary.
	if c, err := startChild(t, copyTree(t, dir)); err != nil {
		t.Fatalf("the gateway does not start on the damaged state: %v", err)
	} else {
		c.kill()
	}
	_, brokers := kafkatest.Start(t, 3, summariesTopic, deadTopic, "edge.offsets")
	cfg := stateConfig(t, dir)
	cfg.Kafka.Brokers = brokers
	st := startStackIn(t, cfg, time.Now, filepath.Join(dir, "outbound"))
	before := len(f.truth)
	f.connect(t, st.gw.Addr())
	last(f)
	// Every publication acknowledged (durable) is applied. (This waited
	// for Publishes to reach f.sent, which counts the runs before too,
	// while Publishes counts this process's, replay included: it never
	// did, and the wait always ran to its deadline.)
	applied := func(s gateway.Stats) bool { return s.Journal.Applied+1 >= st.gw.JournalLog().Stats().Durable }
	if s := settled(t, st.gw, applied); !applied(s) {
		t.Fatalf("journal applied to %d, durable below %d", s.Journal.Applied, st.gw.JournalLog().Stats().Durable)
	}
	st.stopGW()
	stats := st.gw.Stats()

	truth, refused := f.truth[:before:before], 0
	for _, r := range f.truth[before:] {
		if lost(r.dev, r.metric, r.at.Truncate(time.Minute)) {
			refused++
			continue
		}
		truth = append(truth, r)
	}
	if (refused > 0) != wantLost {
		t.Fatalf("%d readings after the restart are for windows lost; the test wants some: %v", refused, wantLost)
	}
	want := expected(truth, time.Minute)
	// One summary per window, one more per late reading folded in.
	wantMsgs := len(want) + lateReadings(truth)
	msgs := kafkatest.Consume(t, brokers, summariesTopic, wantMsgs, 60*time.Second)
	highest := map[winKey]aggregate.Summary{}
	ids := map[string]bool{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatalf("summary %s: %v", m.Value, err)
		}
		if ids[s.ID] {
			t.Errorf("summary %s twice", s.ID)
		}
		ids[s.ID] = true
		k := winKey{s.Device, s.Metric, s.WindowStart.UTC()}
		if prev, ok := highest[k]; !ok || s.Revision > prev.Revision {
			highest[k] = s
		}
	}
	if len(msgs) != wantMsgs {
		t.Errorf("%d summaries, want %d", len(msgs), wantMsgs)
	}
	wrong := 0
	for k, w := range want {
		if g, ok := highest[k]; !ok || !sameStats(g, w) {
			if wrong++; wrong <= 5 {
				t.Errorf("%v:\n got %+v\nwant %+v", k, g, w)
			}
		}
	}
	if wrong > 5 {
		t.Errorf("and %d more windows wrong", wrong-5)
	}
	// The readings refused are dead letters. (The counters may say more:
	// a replay from checkpoint.prev refuses the late readings already in
	// windows a newer checkpoint wrote, and its outputs are not sent
	// again.)
	evicted := 0
	for _, m := range kafkatest.Consume(t, brokers, deadTopic, 0, 60*time.Second) {
		var d struct {
			Reasons []struct {
				Reason string
				Count  int
			}
		}
		if err := json.Unmarshal(m.Value, &d); err != nil {
			t.Fatalf("dead letter %s: %v", m.Value, err)
		}
		for _, r := range d.Reasons {
			if r.Reason == "late_state_evicted" {
				evicted += r.Count
			} else {
				t.Errorf("dead letter %s", m.Value)
			}
		}
	}
	if evicted != refused {
		t.Errorf("%d readings in dead letters as late_state_evicted, want %d", evicted, refused)
	}
	return stats
}

// lateReadings counts the readings of truth that came after a later
// window of their series had closed theirs: each made a revision. (The
// fleet's device clocks only go back for its late readings.)
func lateReadings(truth []sent) int {
	type series struct{ dev, metric string }
	latest := map[series]time.Time{}
	n := 0
	for _, r := range truth {
		s := series{r.dev, r.metric}
		// closed: a reading 5 s (max_out_of_order) past the window's end
		if l, ok := latest[s]; ok && !l.Add(-5*time.Second).Before(r.at.Truncate(time.Minute).Add(time.Minute)) {
			n++
		}
		if r.at.After(latest[s]) {
			latest[s] = r.at
		}
	}
	return n
}

// windowOf decodes a state file's window key: the start (8 bytes, sign
// flipped), then device and metric (uvarint length and bytes).
func windowOf(k []byte) (dev, metric string, start time.Time) {
	start = time.Unix(0, int64(binary.BigEndian.Uint64(k)^(1<<63))).UTC()
	k = k[8:]
	n, l := binary.Uvarint(k)
	dev, k = string(k[l:l+int(n)]), k[l+int(n):]
	n, l = binary.Uvarint(k)
	return dev, string(k[l : l+int(n)]), start
}

func keyOf(dev, metric string, start time.Time) []byte {
	k := binary.BigEndian.AppendUint64(nil, uint64(start.UnixNano())^(1<<63))
	k = binary.AppendUvarint(k, uint64(len(dev)))
	k = append(k, dev...)
	k = binary.AppendUvarint(k, uint64(len(metric)))
	return append(k, metric...)
}

func nothingLost(string, string, time.Time) bool { return false }

// TestStateDamageRecovery: a state file damaged in one page (or one
// checkpoint, or both) after three runs killed with SIGKILL. Run 1 takes
// readings in window 0 and a checkpoint (cp0) of all of them; run 2 closes
// window 0, takes a checkpoint (cp1), which unlinks run 1's journal, and
// readings up to window 2; run 3 more, late ones for window 0, a
// checkpoint (cp2), more. Recovery from cp1 needs run 2's journal after
// it; the journal alone lacks window 0's first readings. After the damage
// the gateway starts, takes late readings for windows closed before the
// crash, and every window's highest revision in Kafka has exactly the
// statistics of the readings sent.
func TestStateDamageRecovery(t *testing.T) {
	f := &fleet{base: time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)}
	dir := history(t, f, func(c *gatewayChild) {
		f.at(10)
		f.at(20)
		c.checkpoint()
	}, func(c *gatewayChild) {
		f.at(70) // closes window 0
		c.checkpoint()
		f.at(80)
		f.at(130) // closes window 1
	}, func(c *gatewayChild) {
		f.at(140)
		f.at(30, 0, 1, 2, 3, 4) // late: revises window 0
		f.at(190)               // closes window 2
		c.checkpoint()
		f.at(200)
	})
	// What the test is about: run 1's readings are in no journal segment
	// any more, only in checkpoints.
	q, err := queue.Open(copyTree(t, filepath.Join(dir, "ingest")), queue.Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if first := q.Stats().First; first <= 1 {
		t.Fatalf("the journal starts at record %d: run 1's segment was not unlinked", first)
	}
	q.Close()
	newest, previous := checkpoints(t, dir)
	after := func(f *fleet) {
		f.at(210)
		f.at(40, 5, 6, 7, 8, 9) // late for window 0, stored since cp1
		f.at(100)               // late for window 1, stored by cp2
	}
	cases := map[string]struct {
		damage   func(t *testing.T, dir string) (lost func(dev, metric string, start time.Time) bool)
		lost     bool
		rebuilds uint64
	}{
		// Pages the last checkpoint wrote: the transaction before is whole.
		"root page: header names another page": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipPage(t, dir, 0, kindOf("leaf", "", true, false))
			return nothingLost
		}, false, 1},
		"windows branch page: type": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipPage(t, dir, 8, kindOf("branch", "windows", true, false))
			return nothingLost
		}, false, 1},
		"newest checkpoint fails its checksum": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipCheckpoint(t, dir, newest)
			return nothingLost
		}, false, 1},
		// bbolt uses the other meta page: the transaction before.
		"newest meta page": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipPage(t, dir, 16, func(p journal.StatePage) bool { return p.NewestMeta })
			return nothingLost
		}, false, 0},
		"page only the transaction before reaches": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipPage(t, dir, 0, kindOf("leaf", "windows", false, true))
			return nothingLost
		}, false, 0},
		// Both checkpoints of state.db: checkpoint.prev and the journal
		// from it.
		"both checkpoints in state.db": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			flipCheckpoint(t, dir, newest)
			flipCheckpoint(t, dir, previous)
			return nothingLost
		}, false, 1},
		// A page both trees share: its windows are lost, and the late
		// readings for them refused rather than made a revision 0.
		"shared windows leaf: type": {func(t *testing.T, dir string) func(string, string, time.Time) bool {
			p := flipPage(t, dir, 8, func(p journal.StatePage) bool {
				if !kindOf("leaf", "windows", true, true)(p) {
					return false
				}
				dev, _, start := windowOf(p.First)
				return start.Equal(f.base) && dev >= "dev-05" && dev < "dev-09"
			})
			return func(dev, metric string, start time.Time) bool {
				k := keyOf(dev, metric, start)
				return bytes.Compare(k, p.First) >= 0 && bytes.Compare(k, p.Last) <= 0
			}
		}, true, 1},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := copyTree(t, dir)
			g := *f
			g.truth, g.clients = append([]sent(nil), f.truth...), nil
			stats := finish(t, dir, &g, after, c.damage(t, dir), c.lost)
			if stats.Journal.StateRebuilds != c.rebuilds {
				t.Errorf("%d state rebuilds, want %d (%s)", stats.Journal.StateRebuilds, c.rebuilds, stats.Journal.StateRecovery)
			}
		})
	}
}

// TestStateDamageJournalOnly: every checkpoint unusable (both in state.db,
// and checkpoint.prev): the journal, whole since the first run, rebuilds
// the state, and the gateway says so.
func TestStateDamageJournalOnly(t *testing.T) {
	f := &fleet{base: time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)}
	dir := history(t, f, func(c *gatewayChild) {
		f.at(10)
		f.at(70)
		c.checkpoint()
		f.at(80)
		f.at(130)
		f.at(20, 0, 1, 2)
		c.checkpoint()
		f.at(140)
	})
	// The root pages of both transactions, and checkpoint.prev.
	path := filepath.Join(dir, "state", "state.db")
	pages, err := journal.StatePages(path)
	if err != nil {
		t.Fatal(err)
	}
	roots := 0
	for _, p := range pages {
		if p.Kind == "leaf" && p.Bucket == "" {
			flipAt(t, path, int64(p.ID)*int64(os.Getpagesize()))
			roots++
		}
	}
	if roots != 2 {
		t.Fatalf("%d root pages, want the two transactions'", roots)
	}
	flipAt(t, filepath.Join(dir, "state", journal.PreviousName), 100)
	stats := finish(t, dir, f, func(f *fleet) {
		f.at(150)
		f.at(30, 3, 4, 5)
		f.at(90)
	}, nothingLost, false)
	if stats.Journal.StateRebuilds != 1 || !strings.Contains(stats.Journal.StateRecovery, "no checkpoint") {
		t.Errorf("%d state rebuilds: %q; want one, from no checkpoint", stats.Journal.StateRebuilds, stats.Journal.StateRecovery)
	}
	if q, _ := filepath.Glob(filepath.Join(dir, "quarantine", "*")); len(q) != 2 {
		t.Errorf("quarantine holds %v; want the damaged state.db and checkpoint.prev", q)
	}
}
