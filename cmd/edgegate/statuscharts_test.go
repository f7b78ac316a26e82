//go:build e2e

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"html"
	"image/png"
	"io"
	"maps"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// These tests load the status page (statusPage, as run.go's handler serves
// it) in headless Chromium against a test server that answers api/status
// and api/history with figures made by the real code (history.add,
// history.view, computeFigures) from synthetic counters, and check what
// the page drew against values worked out here from those counters.
//
// EDGEGATE_STATUS_PAGE=<file> tests that file instead of the embedded page:
// a scratch copy, to see a check fail on a broken page or pass on a fixed
// one without touching status.html.

// pageUnderTest returns the page to serve and the Content-Security-Policy
// the gateway serves it with (taken from pipeline.handler itself).
func pageUnderTest(t *testing.T) (page []byte, csp string) {
	t.Helper()
	rec := httptest.NewRecorder()
	(&pipeline{cfg: &configs.Config{}}).handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), statusPage) {
		t.Fatalf("GET / from pipeline.handler: %d, %d bytes (want the %d of statusPage)", rec.Code, rec.Body.Len(), len(statusPage))
	}
	csp = rec.Header().Get("Content-Security-Policy")
	if csp == "" {
		t.Fatal("GET / from pipeline.handler: no Content-Security-Policy")
	}
	page = statusPage
	if f := os.Getenv("EDGEGATE_STATUS_PAGE"); f != "" {
		var err error
		if page, err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
		t.Logf("testing %s instead of the embedded status page", f)
	}
	return page, csp
}

// pageTZ sets the zone and language Chromium renders times in: the page
// writes times with toLocaleTimeString.
func pageTZ(t *testing.T) {
	t.Setenv("TZ", "UTC")
	t.Setenv("LANG", "en_US.UTF-8")
}

// localTime is a time as the page shows it under pageTZ (en-US).
func localTime(at time.Time) string { return at.UTC().Format("3:04:05 PM") }

func serveJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func servePage(w http.ResponseWriter, page []byte, csp string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if csp != "" {
		w.Header().Set("Content-Security-Policy", csp)
	}
	w.Write(page)
}

// The charts' history: 31 samples 10 s apart, from chartStart to
// chartNow; step i (1..30) is what happened between samples i-1 and i.
var (
	chartStart = time.Date(2026, 3, 9, 10, 0, 5, 0, time.UTC)
	chartNow   = chartStart.Add(chartSteps * historyStep)
)

const chartSteps = 30

// chartDevice is what one device did in a step.
type chartDevice struct{ aggregated, revised, tooLate uint64 }

// chartStepDevices: readings 200 a step (20/s) in steps 1–15, 400 (40/s)
// in steps 16–30. dev-a: 90 aggregated + 10 revising a step, doubled from
// step 16; dev-b: 100 a step, 60 from step 9, 120 from step 16; dev-c is
// first seen in step 9: 30 aggregated + 10 too late, doubled from step 16.
func chartStepDevices(i int) map[string]chartDevice {
	d := map[string]chartDevice{"dev-a": {90, 10, 0}, "dev-b": {100, 0, 0}}
	if i >= 9 {
		d["dev-b"] = chartDevice{60, 0, 0}
		d["dev-c"] = chartDevice{30, 0, 10}
	}
	if i >= 16 {
		for id, v := range d {
			d[id] = chartDevice{2 * v.aggregated, 2 * v.revised, 2 * v.tooLate}
		}
	}
	return d
}

// Summaries 20 a step (2/s), 40 (4/s) from step 16; nothing delivered
// while the link is down (steps 1–12), then 45 a step (4.5/s). Dead
// letters (queued with the summaries) by step.
func chartSummaries(i int) uint64 {
	if i >= 16 {
		return 40
	}
	return 20
}

func chartDelivered(i int) uint64 {
	if i >= 13 {
		return 45
	}
	return 0
}

var chartDead = map[int]map[string]uint64{
	2: {"not_a_number": 3}, 7: {"not_a_number": 2}, 8: {"payload_too_large": 4},
	20: {"not_a_number": 5}, 25: {"payload_too_large": 1}, 30: {"payload_too_large": 1},
}

// chartOldest is the oldest queued record's age at sample i: growing with
// the queue while the link is down, then falling to 20 s.
func chartOldest(i int) time.Duration {
	if i <= 12 {
		return time.Duration(i) * historyStep
	}
	return max(20, 120-20*time.Duration(i-12)) * time.Second
}

// chartStatuses returns the statuses sampled at 0..chartSteps.
func chartStatuses() []status {
	var out []status
	dev := map[string]*aggregate.DeviceStat{}
	var order []string
	var outcomes [3]uint64
	var summaries, enqueued, delivered uint64
	dead := map[string]uint64{}
	for i := 0; i <= chartSteps; i++ {
		at := chartStart.Add(time.Duration(i) * historyStep)
		if i > 0 {
			for _, id := range slices.Sorted(maps.Keys(chartStepDevices(i))) {
				v := chartStepDevices(i)[id]
				if dev[id] == nil {
					dev[id] = &aggregate.DeviceStat{ID: id}
					order = append(order, id)
				}
				d := dev[id]
				d.Aggregated += v.aggregated
				d.Revised += v.revised
				d.TooLate += v.tooLate
				d.LastSeen = at.Add(-time.Second)
				outcomes[0] += v.aggregated
				outcomes[1] += v.revised
				outcomes[2] += v.tooLate
			}
			summaries += chartSummaries(i)
			enqueued += chartSummaries(i)
			for r, n := range chartDead[i] {
				dead[r] += n
				enqueued += n
			}
			delivered += chartDelivered(i)
		}
		st := status{Gateway: "charts-gw", Version: "test", Started: chartStart, Now: at}
		st.MQTT.Outcomes = map[string]uint64{aggregate.Aggregated.String(): outcomes[0],
			aggregate.Revised.String(): outcomes[1], aggregate.TooLate.String(): outcomes[2]}
		st.MQTT.Summaries = summaries
		st.MQTT.DeadLetters = maps.Clone(dead)
		st.MQTT.Clock = gateway.ClockStats{Synchronized: true, Source: "assumed"}
		for _, id := range order {
			st.MQTT.DeviceList = append(st.MQTT.DeviceList, *dev[id])
		}
		st.Kafka = bridge.Stats{Link: bridge.LinkUp, LinkUp: true, LinkSince: chartStart.Add(125 * time.Second), Connects: 1,
			Enqueued: enqueued, Delivered: delivered, Queued: enqueued - delivered, OldestAge: chartOldest(i)}
		out = append(out, st)
	}
	return out
}

// What the page must draw, worked out by hand from the steps above.
var (
	// Per-second rates and levels at the last point, and their largest.
	wantLines = map[string]map[string][2]float64{ // svg id → series → {last, max}
		"c-in":    {"readings": {40, 40}},
		"c-out":   {"summaries": {4, 4}, "deliveries": {4.5, 4.5}},
		"c-queue": {"queued": {106, 249}}, // 240 summaries + 9 dead letters by step 12; then −25 a step for 3, −5 a step for 15, +7 dead letters
		"c-lag":   {"lag": {20, 120}},
	}
	// Minutes the dead letters are counted by: the history's
	// (10:00–10:05, the last is the current one). A step counts in the
	// minute of the sample that ends it.
	wantDeadMinutes = []time.Time{
		time.Date(2026, 3, 9, 10, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 10, 1, 0, 0, time.UTC),
		time.Date(2026, 3, 9, 10, 2, 0, 0, time.UTC), time.Date(2026, 3, 9, 10, 3, 0, 0, time.UTC),
		time.Date(2026, 3, 9, 10, 4, 0, 0, time.UTC), time.Date(2026, 3, 9, 10, 5, 0, 0, time.UTC)}
	wantDead = map[string][]uint64{
		"not_a_number":      {3, 2, 0, 5, 0, 0}, // steps 2 (10:00:25), 7 (10:01:15), 20 (10:03:25)
		"payload_too_large": {0, 4, 0, 0, 1, 1}, // steps 8 (10:01:25), 25 (10:04:15), 30 (10:05:05)
	}
	// Readings aggregated or revising, by whole minute (10:01–10:04:
	// samples 6–11, 12–17, 18–23, 24–29), and a minute over the last one
	// (steps 25–30).
	wantSpark = map[string][]uint64{
		"dev-a": {600, 800, 1200, 1200}, // 6×100; 4×100 + 2×200; 6×200
		"dev-b": {480, 480, 720, 720},   // 3×100 + 3×60; 4×60 + 2×120; 6×120
		"dev-c": {90, 240, 360, 360},    // 3×30 (first seen in step 9); 4×30 + 2×60; 6×60
	}
	wantPerMin = map[string]string{"dev-a": "1200.0", "dev-b": "720.0", "dev-c": "360.0"}
)

// TestStatusPageCharts feeds a known hour of counters through history and
// computeFigures, loads the page in Chromium and checks its line charts,
// dead-letter bars, device sparklines and chart note; the screenshot is
// kept under dist/e2e-artifacts.
func TestStatusPageCharts(t *testing.T) {
	need(t, "chromium")
	pageTZ(t)
	page, csp := pageUnderTest(t)
	sts := chartStatuses()
	h := newHistory()
	for _, st := range sts {
		h.add(st)
	}
	st := sts[len(sts)-1]
	st.Figures = computeFigures(st, h)
	view := h.view(chartNow)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { servePage(w, page, csp) })
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) { serveJSON(w, st) })
	mux.HandleFunc("GET /api/history", func(w http.ResponseWriter, r *http.Request) { serveJSON(w, view) })
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := filepath.Join(repoRoot(t), "dist", "e2e-artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "statuspage-charts.png")
	os.Remove(shot)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One run: the DOM after the script ran, and the screenshot.
	dom, err := chromium(ctx, t, "--lang=en-US", "--window-size=1280,1700", "--virtual-time-budget=3000",
		"--dump-dom", "--screenshot="+shot, srv.URL+"/")
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	checkScreenshot(t, shot, 1280, 1700)
	if e := elemText(dom, "err"); e != "" {
		t.Fatalf("the page reports an error: %s", e)
	}

	// Line charts: one polyline a series, a point a step, the latest step
	// at the right edge ("now") and the first one 10 s after the left
	// (the axis spans the 5 min the samples cover).
	const left, right = 42.0, 352.0
	spanS := chartNow.Sub(chartStart).Seconds()
	for _, svg := range slices.Sorted(maps.Keys(wantLines)) {
		lines := svgElems(dom, svg, "polyline")
		if len(lines) != len(wantLines[svg]) {
			t.Errorf("%s: %d polylines, want %d (%v)", svg, len(lines), len(wantLines[svg]), lines)
		}
		for _, l := range lines {
			name := l["data-series"]
			want, ok := wantLines[svg][name]
			if !ok {
				t.Errorf("%s: unexpected series %q", svg, name)
				continue
			}
			if l["data-n"] != strconv.Itoa(chartSteps) {
				t.Errorf("%s %s: data-n %s, want %d", svg, name, l["data-n"], chartSteps)
			}
			if got := attrFloat(t, l, "data-last"); !near(got, want[0]) {
				t.Errorf("%s %s: data-last %v, want %v", svg, name, got, want[0])
			}
			if got := attrFloat(t, l, "data-max"); !near(got, want[1]) {
				t.Errorf("%s %s: data-max %v, want %v", svg, name, got, want[1])
			}
			pts := strings.Fields(l["points"])
			if len(pts) != chartSteps {
				t.Errorf("%s %s: %d points drawn, want %d", svg, name, len(pts), chartSteps)
				continue
			}
			x0, _, _ := strings.Cut(pts[0], ",")
			xn, _, _ := strings.Cut(pts[len(pts)-1], ",")
			if want := left + (right-left)*historyStep.Seconds()/spanS; !nearText(x0, want) || !nearText(xn, right) {
				t.Errorf("%s %s: points from x=%s to x=%s, want %.1f to %.1f", svg, name, x0, xn, want, right)
			}
		}
		if got := svgTexts(dom, svg); !slices.Contains(got, "−5 min") || !slices.Contains(got, "now") {
			t.Errorf("%s: axis labels %q, want −5 min … now", svg, got)
		}
	}
	for id, want := range map[string]string{
		"l-in": "readings/s 40.0", "l-out": "summaries/s 4 delivered/s 4.5",
		"l-queue": "queued 106 drain ETA: about 24 s at 4.5 records/s (last minute)", // 106 / 4.5 = 23.6 s
		"l-lag":   "oldest queued 20 s",
	} {
		if got := legendText(dom, id); got != want {
			t.Errorf("legend %s: %q, want %q", id, got, want)
		}
	}

	// Dead letters: a bar a reason and minute with any, and the totals.
	type bar struct {
		reason, minute string
		count          uint64
	}
	var want []bar
	for r, counts := range wantDead {
		for i, n := range counts {
			if n > 0 {
				want = append(want, bar{r, wantDeadMinutes[i].Format(time.RFC3339), n})
			}
		}
	}
	var got []bar
	for _, r := range svgElems(dom, "c-dead", "rect") {
		n, err := strconv.ParseUint(r["data-count"], 10, 64)
		if err != nil {
			t.Errorf("c-dead: rect %v: %v", r, err)
		}
		got = append(got, bar{r["data-reason"], r["data-minute"], n})
	}
	byKey := func(a, b bar) int { return strings.Compare(a.reason+a.minute, b.reason+b.minute) }
	slices.SortFunc(want, byKey)
	slices.SortFunc(got, byKey)
	if !slices.Equal(got, want) {
		t.Errorf("dead-letter bars:\n got %v\nwant %v", got, want)
	}
	if got, want := legendText(dom, "l-dead"), "not_a_number 10 payload_too_large 6"; got != want {
		t.Errorf("dead-letter legend %q, want %q", got, want)
	}
	if got := svgTexts(dom, "c-dead"); !slices.Contains(got, "−5 min") || !slices.Contains(got, "this minute") {
		t.Errorf("c-dead: axis labels %q, want −5 min … this minute", got)
	}

	// Devices: readings/min over the last minute, and a sparkline of
	// their whole minutes.
	rows := deviceRows(dom)
	if ids := slices.Sorted(maps.Keys(rows)); !slices.Equal(ids, []string{"dev-a", "dev-b", "dev-c"}) {
		t.Fatalf("device rows %v, want dev-a dev-b dev-c", ids)
	}
	for id, cells := range rows {
		if len(cells) < 4 {
			t.Errorf("%s: row %q", id, cells)
			continue
		}
		if got := tagText(cells[2]); got != wantPerMin[id] {
			t.Errorf("%s: readings/min %q, want %q", id, got, wantPerMin[id])
		}
		var vals []string
		for _, v := range wantSpark[id] {
			vals = append(vals, strconv.FormatUint(v, 10))
		}
		if m := regexp.MustCompile(`<polyline [^>]*data-values="([^"]*)"`).FindStringSubmatch(cells[3]); m == nil || m[1] != strings.Join(vals, ",") {
			t.Errorf("%s: sparkline %q, want data-values %q", id, cells[3], strings.Join(vals, ","))
		}
	}

	// The note: a step a point, the latest sample's time.
	if got, want := elemText(dom, "chartnote"), fmt.Sprintf("Last hour · sampled every 10 s, %d samples, the latest at %s", chartSteps+1, localTime(chartNow)); got != want {
		t.Errorf("chart note %q, want %q", got, want)
	}
	if got, want := elemText(dom, "sub"), "readings/s in (last minute)"; !strings.HasSuffix(got, "· 40.0 "+want) {
		t.Errorf("sub-title %q, want it to end with 40.0 %s", got, want)
	}
	t.Logf("status page screenshot (test artifact): %s", shot)
}

// The cards: each case is a status (and its history) served under
// /s/<case>/; one Chromium run loads them all, each in a frame of a
// harness page that copies each frame's DOM out once it has rendered.
type cardCase struct {
	name                    string
	kafka                   bridge.Stats
	before                  time.Duration // the earlier sample's age
	deliveredBefore         uint64        // delivered at the earlier sample
	link, linkClass, linkTo string        // card, class, line under it
	eta, etaClass, etaInfo  string
}

func cardCases() []cardCase {
	now := chartNow
	return []cardCase{{
		name:   "connecting-waiting", // records queued 20 s ago, nothing delivered yet
		kafka:  bridge.Stats{Link: bridge.LinkConnecting, LinkSince: now.Add(-15 * time.Second), Queued: 12, OldestAge: 20 * time.Second},
		before: 20 * time.Second,
		link:   "connecting", linkClass: "neutral", linkTo: "connecting (for 15 s)",
		eta: "waiting", etaClass: "neutral", etaInfo: "waiting: 12 records queued, the oldest 20 s ago",
	}, {
		name: "up-draining", // 540 queued, 270 delivered in the last minute: 4.5/s, 120 s
		kafka: bridge.Stats{Link: bridge.LinkUp, LinkUp: true, LinkSince: now.Add(-125 * time.Second), Connects: 3,
			Queued: 540, Delivered: 1270, OldestAge: 40 * time.Second},
		before: time.Minute, deliveredBefore: 1000,
		link: "up", linkClass: "ok", linkTo: "connected since " + localTime(now.Add(-125*time.Second)) + " · 3 connects since start",
		eta: "2 min", etaClass: "ok", etaInfo: "about 2 min at 4.5 records/s (last minute)",
	}, {
		name:   "idle-empty",
		kafka:  bridge.Stats{Link: bridge.LinkIdle, LinkSince: now.Add(-time.Minute), LinkChecked: now.Add(-5 * time.Second)},
		before: time.Minute,
		link:   "idle", linkClass: "neutral", linkTo: "idle: reachable, nothing to send (checked 5 s ago)",
		eta: "empty", etaClass: "ok", etaInfo: "empty at 0.0 records/s (last minute)",
	}, {
		name: "down-not-draining",
		kafka: bridge.Stats{Link: bridge.LinkDown, LinkSince: now.Add(-205 * time.Second), LinkChecked: now.Add(-3 * time.Second),
			LinkError: "dial tcp 192.0.2.7:9092: connect: connection refused", Queued: 300, Delivered: 80, OldestAge: 205 * time.Second},
		before: time.Minute, deliveredBefore: 80,
		link: "down", linkClass: "bad", linkTo: "since " + localTime(now.Add(-205*time.Second)) + ": dial tcp 192.0.2.7:9092: connect: connection refused",
		eta: "not draining", etaClass: "bad", etaInfo: "not draining: the link is down; 300 records wait, the oldest for 3 min",
	}, {
		name: "up-stuck", // up, but nothing delivered for a minute while records waited 100 s
		kafka: bridge.Stats{Link: bridge.LinkUp, LinkUp: true, LinkSince: now.Add(-10 * time.Minute), Connects: 1,
			Queued: 50, Delivered: 700, OldestAge: 100 * time.Second},
		before: time.Minute, deliveredBefore: 700,
		link: "up", linkClass: "ok", linkTo: "connected since " + localTime(now.Add(-10*time.Minute)) + " · 1 connect since start",
		eta: "not draining", etaClass: "bad", etaInfo: "not draining: nothing delivered for a minute; 50 records wait, the oldest for 2 min",
	}, {
		// 675 queued at 4.5/s: 150 s, 2.5 min. The gateway writes it "2 min"
		// (Go's %.0f rounds a tie to even); the card must say the same.
		name: "up-draining-tie",
		kafka: bridge.Stats{Link: bridge.LinkUp, LinkUp: true, LinkSince: now.Add(-125 * time.Second), Connects: 2,
			Queued: 675, Delivered: 1270, OldestAge: 50 * time.Second},
		before: time.Minute, deliveredBefore: 1000,
		link: "up", linkClass: "ok", linkTo: "connected since " + localTime(now.Add(-125*time.Second)) + " · 2 connects since start",
		eta: "2 min", etaClass: "ok", etaInfo: "about 2 min at 4.5 records/s (last minute)",
	}}
}

// status makes the case's status, its history (two samples) and its
// figures.
func (c cardCase) status() (status, *history) {
	mk := func(at time.Time, delivered uint64) status {
		st := status{Gateway: "cards-gw", Version: "test", Started: chartStart, Now: at, Kafka: c.kafka}
		st.MQTT.Outcomes = map[string]uint64{}
		st.MQTT.DeadLetters = map[string]uint64{}
		st.Kafka.Delivered = delivered
		return st
	}
	h := newHistory()
	h.add(mk(chartNow.Add(-c.before), c.deliveredBefore))
	st := mk(chartNow, c.kafka.Delivered)
	h.add(st)
	st.Figures = computeFigures(st, h)
	return st, h
}

// cardsHarness loads each case in a frame and, once every frame has drawn
// its cards (or after 4 s), writes each frame's DOM as the text of
// <pre id="case-<name>">.
const cardsHarness = `<!doctype html><html><body><script>
const cases = %s;
for (const c of cases) {
  const f = document.createElement("iframe");
  f.id = "f-" + c; f.src = "/s/" + c + "/"; f.width = 1280; f.height = 600;
  document.body.appendChild(f);
}
const drawn = c => { const d = document.getElementById("f-" + c).contentDocument; const e = d && d.getElementById("etainfo"); return e && e.textContent !== ""; };
let waited = 0;
function collect() {
  if (!cases.every(drawn) && (waited += 100) < 4000) { setTimeout(collect, 100); return; }
  for (const c of cases) {
    const p = document.createElement("pre");
    p.id = "case-" + c;
    const d = document.getElementById("f-" + c).contentDocument;
    p.textContent = d ? d.documentElement.outerHTML : "";
    document.body.appendChild(p);
  }
  for (const c of cases) document.getElementById("f-" + c).remove();
}
setTimeout(collect, 100);
</script></body></html>`

// TestStatusPageCards checks the Kafka link card (each link state) and the
// Drain ETA card (each drain state): text, class and the line under each.
func TestStatusPageCards(t *testing.T) {
	need(t, "chromium")
	pageTZ(t)
	page, csp := pageUnderTest(t)
	cases := cardCases()
	var names []string
	mux := http.NewServeMux()
	for _, c := range cases {
		st, h := c.status()
		if st.Figures.Link.State != c.kafka.Link {
			t.Fatalf("%s: link %q", c.name, st.Figures.Link.State)
		}
		view := h.view(chartNow)
		names = append(names, c.name)
		mux.HandleFunc("GET /s/"+c.name+"/{$}", func(w http.ResponseWriter, r *http.Request) { servePage(w, page, csp) })
		mux.HandleFunc("GET /s/"+c.name+"/api/status", func(w http.ResponseWriter, r *http.Request) { serveJSON(w, st) })
		mux.HandleFunc("GET /s/"+c.name+"/api/history", func(w http.ResponseWriter, r *http.Request) { serveJSON(w, view) })
	}
	list, _ := json.Marshal(names)
	mux.HandleFunc("GET /cards", func(w http.ResponseWriter, r *http.Request) {
		servePage(w, fmt.Appendf(nil, cardsHarness, list), "")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dom, err := chromium(ctx, t, "--lang=en-US", "--virtual-time-budget=5000", "--dump-dom", srv.URL+"/cards")
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	card := regexp.MustCompile(`<b id="(link|eta)"(?: class="([^"]*)")?>([^<]*)</b><span id="(?:linkinfo|etainfo)">([^<]*)</span>`)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := regexp.MustCompile(`(?s)<pre id="case-` + regexp.QuoteMeta(c.name) + `">(.*?)</pre>`).FindStringSubmatch(dom)
			if m == nil {
				t.Fatalf("no DOM for the case in the harness:\n%s", dom)
			}
			frame := html.UnescapeString(m[1])
			if e := elemText(frame, "err"); e != "" {
				t.Fatalf("the page reports an error: %s", e)
			}
			got := map[string][3]string{}
			for _, m := range card.FindAllStringSubmatch(frame, -1) {
				got[m[1]] = [3]string{cleanText(m[3]), m[2], cleanText(m[4])}
			}
			if want := [3]string{c.link, c.linkClass, c.linkTo}; got["link"] != want {
				t.Errorf("Kafka link card (text, class, line) %q, want %q", got["link"], want)
			}
			if want := [3]string{c.eta, c.etaClass, c.etaInfo}; got["eta"] != want {
				t.Errorf("Drain ETA card (text, class, line) %q, want %q", got["eta"], want)
			}
		})
	}
}

// TestStatusPageSelfContained checks that the page loads nothing from
// elsewhere: its text names no outside asset, and in Chromium, with every
// request sent through a proxy that records it, the only requests are the
// page, api/status and api/history.
func TestStatusPageSelfContained(t *testing.T) {
	need(t, "chromium")
	page, _ := pageUnderTest(t)
	text := string(page)
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)\b(?:src|href|action|poster|srcset|data)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)`),
		regexp.MustCompile(`(?i)@import`),
		regexp.MustCompile(`(?i)url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)`),
		regexp.MustCompile(`(?i)<(?:link|iframe|embed|object|img|audio|video|source)\b`),
		regexp.MustCompile(`(?i)\b(?:WebSocket|EventSource|XMLHttpRequest|sendBeacon|importScripts|import\s*\()`),
		regexp.MustCompile(`(?i)referrer`), // the proxy below tells the page's requests by their referrer
	} {
		if m := re.FindString(text); m != "" {
			t.Errorf("the page refers to an outside asset or channel: %q", m)
		}
	}
	// Every URL in it: only the SVG namespace (a name, not fetched).
	for _, u := range regexp.MustCompile(`(?i)(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^"'\s)]*`).FindAllString(text, -1) {
		if u != "http://www.w3.org/2000/svg" {
			t.Errorf("the page names %q", u)
		}
	}
	// fetch only api/status and api/history, relative.
	for _, m := range regexp.MustCompile(`getJSON\(([^)]*)\)|fetch\(([^,)]*)`).FindAllStringSubmatch(text, -1) {
		arg := m[1] + m[2]
		if arg != `"api/status"` && arg != `"api/history"` && arg != "path" {
			t.Errorf("the page fetches %s", arg)
		}
	}

	// Chromium sends every request, loopback or not, to a proxy that
	// records it (HTTPS too: it answers CONNECT and reads the request
	// inside, Chromium told to take its certificate): the page's own host
	// is a name only the proxy knows. The page is served without its
	// Content-Security-Policy, which would block a request for an outside
	// asset before it is made, hiding it from this check.
	st := chartStatuses()[chartSteps]
	h := newHistory()
	for _, s := range chartStatuses() {
		h.add(s)
	}
	st.Figures = computeFigures(st, h)
	view := h.view(chartNow)
	const host = "edgegate.test"
	reqs := recordingProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != host || r.Method != http.MethodGet {
			http.Error(w, "not here", http.StatusBadGateway)
			return
		}
		switch r.URL.Path {
		case "/":
			servePage(w, page, "")
		case "/api/status":
			serveJSON(w, st)
		case "/api/history":
			serveJSON(w, view)
		default:
			http.NotFound(w, r)
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dom, err := chromium(ctx, t, "--proxy-server="+reqs.url, "--proxy-bypass-list=<-loopback>", "--ignore-certificate-errors",
		// Fewer requests of Chromium's own (they are told apart below).
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions",
		"--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate",
		"--virtual-time-budget=3000", "--dump-dom", "http://"+host+"/")
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	seen := map[string]bool{}
	for _, r := range reqs.all() {
		// The page's requests: to its host, or made from it: a referrer
		// or origin naming it, or a fetch site other than "none" (the
		// browser's own). Chromium's own requests (its component updater,
		// its accounts) carry none of these. (A page that hid its
		// referrer could make a plain-HTTP request look like Chromium's:
		// the page's text may not set a referrer policy, above.)
		sfs := r.header.Get("Sec-Fetch-Site")
		fromPage := r.host == host || strings.Contains(r.header.Get("Referer"), "//"+host+"/") ||
			r.header.Get("Origin") == "http://"+host || (sfs != "" && sfs != "none")
		what := r.method + " " + r.scheme + "://" + r.host + r.path
		switch {
		case !fromPage:
			t.Logf("Chromium's own request, not the page's: %s", what)
		case r.host == host && r.method == http.MethodGet && (r.path == "/" || r.path == "/api/status" || r.path == "/api/history"):
			seen[r.path] = true
		case r.host == host && r.method == http.MethodGet && r.path == "/favicon.ico":
			// Chromium asks for a favicon the page does not declare.
			t.Logf("Chromium asked for %s", what)
		default:
			t.Errorf("the page requested %s (referrer %q, fetch site %q)", what, r.header.Get("Referer"), sfs)
		}
	}
	for _, p := range []string{"/", "/api/status", "/api/history"} {
		if !seen[p] {
			t.Errorf("no request for %s", p)
		}
	}
	if e := elemText(dom, "err"); e != "" || !strings.Contains(dom, `data-series="readings"`) {
		t.Errorf("the page did not draw through the proxy (error %q)", e)
	}
}

// proxied is a request the recording proxy got.
type proxied struct {
	method, scheme, host, path string
	header                     http.Header
}

type proxyLog struct {
	url  string
	mu   sync.Mutex
	reqs []proxied
}

func (l *proxyLog) add(r *http.Request, scheme string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, proxied{r.Method, scheme, r.Host, r.URL.Path, r.Header.Clone()})
}

func (l *proxyLog) all() []proxied {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// recordingProxy is an HTTP proxy that records every request and answers
// it with serve: plain HTTP ones as they come, HTTPS ones (CONNECT) by
// ending the TLS itself with a self-signed certificate and reading the
// requests inside.
func recordingProxy(t *testing.T, serve http.Handler) *proxyLog {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "recording proxy"},
		DNSNames: []string{"*"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	l := &proxyLog{}
	var conns sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			l.add(r, "http")
			serve.ServeHTTP(w, r)
			return
		}
		l.add(r, "connect")
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
			tc := tls.Server(conn, tlsCfg)
			req, err := http.ReadRequest(bufio.NewReader(tc))
			if err != nil {
				return
			}
			l.add(req, "https")
			io.WriteString(tc, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		}()
	}))
	t.Cleanup(func() { srv.Close(); conns.Wait() })
	l.url = srv.URL
	return l
}

// checkScreenshot fails unless path is a w×h PNG with more than one
// colour in it.
func checkScreenshot(t *testing.T, path string, w, h int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot %s (%d bytes): %v", path, len(b), err)
	}
	if r := img.Bounds(); r.Dx() != w || r.Dy() != h {
		t.Errorf("screenshot %s is %dx%d, want %dx%d", path, r.Dx(), r.Dy(), w, h)
	}
	colours := map[[4]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y && len(colours) < 3; y += 7 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 7 {
			r, g, b, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colours) < 3 {
		t.Errorf("screenshot %s is blank", path)
	}
}

// repoRoot is the module's root: the directory up from here with go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

var attrRE = regexp.MustCompile(`([\w:-]+)="([^"]*)"`)

// svgElems returns the attributes of each tag element in the svg with the
// given id.
func svgElems(dom, id, tag string) []map[string]string {
	_, s, ok := strings.Cut(dom, `<svg id="`+id+`"`)
	if !ok {
		return nil
	}
	s, _, _ = strings.Cut(s, "</svg>")
	var out []map[string]string
	for _, m := range regexp.MustCompile(`<`+tag+`\b([^>]*)>`).FindAllStringSubmatch(s, -1) {
		a := map[string]string{}
		for _, kv := range attrRE.FindAllStringSubmatch(m[1], -1) {
			a[kv[1]] = html.UnescapeString(kv[2])
		}
		out = append(out, a)
	}
	return out
}

// svgTexts returns the texts of the svg with the given id.
func svgTexts(dom, id string) []string {
	_, s, ok := strings.Cut(dom, `<svg id="`+id+`"`)
	if !ok {
		return nil
	}
	s, _, _ = strings.Cut(s, "</svg>")
	var out []string
	for _, m := range regexp.MustCompile(`<text\b[^>]*>([^<]*)</text>`).FindAllStringSubmatch(s, -1) {
		out = append(out, cleanText(m[1]))
	}
	return out
}

// elemText is the text of the element with the given id (one that holds
// no element of its own tag).
func elemText(dom, id string) string {
	m := regexp.MustCompile(`<\w+\b[^>]*\bid="` + regexp.QuoteMeta(id) + `"[^>]*>`).FindStringIndex(dom)
	if m == nil {
		return "<missing #" + id + ">"
	}
	name := regexp.MustCompile(`^<(\w+)`).FindStringSubmatch(dom[m[0]:])[1]
	s, _, _ := strings.Cut(dom[m[1]:], "</"+name+">")
	return tagText(s)
}

// legendText is a legend's items, each its text, joined by a space.
func legendText(dom, id string) string {
	m := regexp.MustCompile(`(?s)<div class="legend" id="` + id + `">(.*?)</div>`).FindStringSubmatch(dom)
	if m == nil {
		return "<missing #" + id + ">"
	}
	var items []string
	for _, it := range regexp.MustCompile(`<i\b[^>]*></i>([^<]*)`).FindAllStringSubmatch(m[1], -1) {
		items = append(items, cleanText(it[1]))
	}
	return strings.Join(items, " ")
}

// deviceRows returns the cells (their HTML) of each row of the devices
// table, by device.
func deviceRows(dom string) map[string][]string {
	_, tb, _ := strings.Cut(dom, `<table id="devices">`)
	tb, _, _ = strings.Cut(tb, "</table>")
	_, tb, _ = strings.Cut(tb, "<tbody>")
	rows := map[string][]string{}
	for _, tr := range regexp.MustCompile(`(?s)<tr>(.*?)</tr>`).FindAllStringSubmatch(tb, -1) {
		var cells []string
		for _, td := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(tr[1], -1) {
			cells = append(cells, td[1])
		}
		if len(cells) > 0 {
			rows[tagText(cells[0])] = cells
		}
	}
	return rows
}

// tagText is s without its tags, unescaped, its spaces plain.
func tagText(s string) string { return cleanText(tag.ReplaceAllString(s, "")) }

func cleanText(s string) string {
	s = strings.NewReplacer("\u202f", " ", "\u00a0", " ").Replace(html.UnescapeString(s))
	return strings.TrimSpace(s)
}

func attrFloat(t *testing.T, a map[string]string, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(a[name], 64)
	if err != nil {
		t.Errorf("%s=%q: %v", name, a[name], err)
		return math.NaN()
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// nearText says whether a coordinate the page wrote (one decimal) is v.
func nearText(s string, v float64) bool {
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && math.Abs(f-v) <= 0.051
}
