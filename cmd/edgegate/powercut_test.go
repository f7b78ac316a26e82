//go:build e2e

package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgegate/edgegate/bridge/kafkatest"
	"github.com/edgegate/edgegate/firmware-sim/sdcard"
)

var (
	cuts  = flag.Int("cuts", 0, "power-cut loop: the number of cuts (default 24, 300 with -long)")
	cutAt = flag.String("cutat", "", "power-cut loop: only the cut points whose name matches this regular expression")
)

// cutPoint is where in the gateway's work a power cut falls: at the
// skip-th operation match accepts (any instant when match is nil). The
// gateway drops segments and rolls new ones mostly just after a start,
// so those cut points are armed after a SIGKILL, before it starts again.
type cutPoint struct {
	name    string
	atStart bool // armed after a SIGKILL, before the gateway starts again
	match   func(op sdcard.Op) bool
}

func opIn(kind sdcard.OpKind, prefix string) func(sdcard.Op) bool {
	return func(op sdcard.Op) bool { return op.Kind == kind && strings.HasPrefix(op.Path, prefix) }
}

var cutPoints = []cutPoint{
	{name: "any instant"},
	{name: "checkpoint (state.db written)", match: opIn(sdcard.OpWrite, "data/state/state.db")},
	{name: "checkpoint (state.db synced)", match: opIn(sdcard.OpFsync, "data/state/state.db")},
	{name: "checkpoint (the previous one kept)", match: func(op sdcard.Op) bool {
		return op.Kind == sdcard.OpRename && op.To == "data/state/checkpoint.prev"
	}},
	{name: "journal segments dropped", atStart: true, match: opIn(sdcard.OpUnlink, "data/ingest/")},
	{name: "queue segments dropped", atStart: true, match: opIn(sdcard.OpUnlink, "data/outbound/")},
	{name: "delivery (position stored)", match: func(op sdcard.Op) bool {
		return op.Kind == sdcard.OpRename && op.To == "data/outbound/meta"
	}},
	{name: "journal written", match: opIn(sdcard.OpWrite, "data/ingest/")},
	{name: "start: segment roll", atStart: true, match: func(op sdcard.Op) bool {
		return op.Kind == sdcard.OpCreate && strings.HasSuffix(op.Path, ".seg")
	}},
	{name: "start: recovery", atStart: true, match: func(sdcard.Op) bool { return true }},
}

// TestPowerCut is TestCrashLoop on a card that loses power: the data
// directory is on an sdcard filesystem, and at each cut the gateway is
// stopped at an instant (a checkpoint, a segment roll, a queue drop, a
// delivery, recovery itself, or any), killed, and everything the card
// had not made durable is thrown away (all of it, a torn prefix, or a
// random subset). Devices with persistent sessions publish at QoS 1 and
// QoS 2 (late readings among them) and resend what was not acknowledged;
// Kafka outlives the gateway. At the end a read_committed consumer must
// find every acknowledged reading exactly once, and the gateway must have
// started after every cut.
func TestPowerCut(t *testing.T) {
	n := 24
	if *long {
		n = 300
	}
	if *cuts > 0 {
		n = *cuts
	}
	if err := sdcard.Available(); err != nil {
		t.Fatalf("the power-cut loop needs FUSE: %v", err)
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)

	dir := t.TempDir()
	bin := build(t, dir, ".", "edgegate", runtime.GOARCH, "")
	_, brokers := kafkatest.Start(t, 3, "edge.summaries", "edge.deadletter", "edge.offsets")
	mnt := filepath.Join(dir, "card")
	os.Mkdir(mnt, 0o755)
	card, err := sdcard.Mount(mnt, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := card.Unmount(); err != nil {
			t.Error(err)
		}
	})
	logs, err := os.MkdirTemp("", "edgegate-powercut-logs-")
	if err != nil {
		t.Fatal(err)
	}
	g := &crashGateway{t: t, bin: bin, cfg: filepath.Join(dir, "edgegate.yaml"), mqtt: kafkatest.Addr(kafkatest.FreePort(t)), logs: logs}
	os.WriteFile(g.cfg, []byte(fmt.Sprintf(`gateway: {id: powercut-gw, data_dir: %s}
mqtt: {listen: "%s", allow_anonymous: true, publish_rate_per_client: 0}
kafka: {brokers: ["%s"]}
http: {listen: ""}
storage: {checkpoint_interval: 300ms}
aggregate: {allowed_lateness: 3h, max_retained_windows: 2}
log: {level: info}
clock: {synchronized: always}
`, filepath.Join(mnt, "data"), g.mqtt, brokers[0])), 0o600)
	g.start()
	defer func() {
		if g.cmd.ProcessState == nil {
			g.cmd.Process.Signal(syscall.SIGKILL)
			card.Release()
			g.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("gateway logs kept in %s", g.logs)
		} else {
			os.RemoveAll(g.logs)
		}
	}()

	// Readings 50 ms apart in event time from eight hours ago (a long run
	// stays in the past), so that windows close (and are delivered) every
	// few seconds; every 500th is 2 min late and revises a closed window.
	// Odd devices publish at QoS 2.
	const devices, inflight = 6, 4
	base := time.Now().UTC().Truncate(time.Minute).Add(-8 * time.Hour)
	stamp := func(i int) time.Time {
		t := base.Add(time.Duration(i) * 50 * time.Millisecond)
		if i%500 == 499 && i > 3000 {
			t = t.Add(-2*time.Minute - 5*time.Millisecond)
		}
		return t
	}
	value := func(d, i int) float64 { return float64((d*7919+i*31)%200) / 2 }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl := startFleetQoS(t, ctx, g.mqtt, "cut-dev", devices, inflight, func(d, i int) string {
		return fmt.Sprintf(`{"v":%g,"t":%d}`, value(d, i), stamp(i).UnixMilli())
	}, func(d int) byte { return byte(1 + d%2) })

	points := cutPoints
	if *cutAt != "" {
		re := regexp.MustCompile(*cutAt)
		points = nil
		for _, cp := range cutPoints {
			if re.MatchString(cp.name) {
				points = append(points, cp)
			}
		}
	}
	losses := []sdcard.Loss{sdcard.LoseUnsynced, sdcard.TornWrite, sdcard.Reordered}
	fired := map[string]int{}
	var lost, kept int64
	var undone, starts int
	for c := range n {
		cp := points[c%len(points)]
		skip := 1 + rng.IntN(3)
		switch cp.name {
		case "start: recovery":
			skip = 1 + rng.IntN(400)
		case "start: segment roll":
			skip = 1 + rng.IntN(2) // the journal's new segment, or the queue's
		}
		arm := func() {
			seen := 0
			card.FreezeAt(func(op sdcard.Op) bool {
				if cp.match == nil || !cp.match(op) {
					return false
				}
				seen++
				return seen == skip
			})
		}
		if cp.atStart {
			// A SIGKILL (the card keeps everything), then the cut falls
			// while the gateway starts again. It runs a while first, so
			// that its segments hold records and the start rolls them.
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
			g.kill()
			arm()
			g.launch()
		} else {
			time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
			if cp.match != nil {
				arm()
			}
		}
		if cp.match == nil {
			card.Freeze()
		}
		select {
		case <-card.Frozen():
		case <-time.After(4 * time.Second):
			card.Freeze() // the operation did not come: any instant, then
		}
		g.cmd.Process.Signal(syscall.SIGKILL)
		card.Release()
		g.cmd.Wait()
		if l := g.log(); strings.Contains(l, "panic:") || strings.Contains(l, "fatal error:") {
			t.Fatalf("cut %d: the gateway crashed before the cut:\n%s", c, l)
		}
		loss := losses[rng.IntN(len(losses))]
		rep, err := card.PowerCut(loss)
		if err != nil {
			t.Fatalf("cut %d: %v", c, err)
		}
		t.Logf("cut %2d at %-34q %s", c, cp.name, rep)
		if cp.match == nil || rep.FrozenAt != "" {
			fired[cp.name]++
		} else {
			fired["any instant (fallback for "+cp.name+")"]++
		}
		lost += rep.LostBytes
		kept += rep.KeptBytes
		undone += rep.UndoneEntries
		g.start() // fails the test if the gateway does not come up
		starts++
		if l := g.log(); strings.Contains(l, "panic:") {
			t.Fatalf("cut %d: the gateway panicked at start:\n%s", c, l)
		}
	}
	fl.finish(t)
	if err := g.stop(); err != nil { // SIGTERM closes every open window
		t.Fatalf("final stop: %v\n%s", err, g.log())
	}
	g.start()
	acked := make([]int, devices)
	for d := range devices {
		acked[d] = int(fl.acked[d].Load())
	}
	records, windows := checkExactlyOnce(t, brokers, "cut-dev", acked, stamp, value)
	var names []string
	for k := range fired {
		names = append(names, k)
	}
	sort.Strings(names)
	var by []string
	for _, k := range names {
		by = append(by, fmt.Sprintf("%s: %d", k, fired[k]))
	}
	t.Logf("%d power cuts (%s); %d starts after a cut, all up; unsynced bytes thrown away %d, kept %d; %d directory entries undone",
		n, strings.Join(by, ", "), starts, lost, kept, undone)
	t.Logf("%d readings from %d devices (QoS 1 and 2) in %d windows, %d summary records; %d publish errors retried",
		sum(acked), devices, windows, records, fl.errs.Load())
	if err := g.stop(); err != nil {
		t.Errorf("last stop: %v", err)
	}
}
