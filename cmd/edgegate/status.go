package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// cmdStatus is "edgegate status": the running gateway's facts, read from
// its /api/status.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagSet("status", stderr)
	url := fs.String("url", "", "the gateway's HTTP endpoint, e.g. http://127.0.0.1:9100 (default: http.listen of --config, or of the default config)")
	path := fs.String("config", "", "config file whose http.listen to use")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *url == "" {
		cfg := configs.Default()
		if *path != "" {
			c, err := loadConfig(*path)
			if err != nil {
				return err
			}
			cfg = *c
		}
		if cfg.HTTP.Listen == "" {
			return usageError{errors.New("status: http.listen is empty in the config; give --url")}
		}
		*url = "http://" + cfg.HTTP.Listen
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(*url, "/")+"/api/status", nil)
	if err != nil {
		return usageError{fmt.Errorf("status: --url: %w", err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: is the gateway running? %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: %s answered %s", *url, resp.Status)
	}
	var st status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("status: %s: %w", *url, err)
	}
	printStatus(stdout, st)
	return nil
}

// printClock prints the gateway's clock and the devices' clocks.
func printClock(row func(name, format string, args ...any), m gateway.Stats) {
	c := m.Clock
	sync := "NOT synchronized (no NTP answer yet?)"
	if c.Synchronized {
		sync = "synchronized"
	}
	detail := c.Source
	if c.MaxError > 0 {
		detail += fmt.Sprintf(", max error %s", c.MaxError.Round(time.Microsecond))
	}
	if c.Error != "" {
		detail += ", " + c.Error
	}
	steps := "no steps"
	if c.Steps > 0 {
		steps = fmt.Sprintf("%d steps, the latest %+v at %s", c.Steps, c.LastStep.Round(time.Millisecond), c.LastStepAt.UTC().Format(time.RFC3339))
	}
	if c.Offset != 0 {
		steps += fmt.Sprintf("; keeping time by the monotonic clock, %+v from the wall clock", c.Offset.Round(time.Millisecond))
	}
	row("clock", "%s (%s), %s", sync, detail, steps)
	if h := m.Hold; h.Readings > 0 || h.Rebased > 0 || h.Unverified > 0 {
		row("held", "%d readings waiting for the clock (%.1f MiB, for %s); %d re-based to true time, %d unverified so far",
			h.Readings, float64(h.Bytes)/(1<<20), h.Age.Round(time.Second), h.Rebased, h.Unverified)
	}
	var skewed []string
	for _, d := range m.DeviceList {
		if d.ClockSkewed {
			skewed = append(skewed, fmt.Sprintf("%s %+v", d.ID, d.ClockOffset.Round(time.Millisecond)))
		}
	}
	unset := m.Outcomes["device_clock_unset"] + m.Outcomes["gateway_clock_unset"]
	if len(skewed) > 0 || m.SkewedDevices > 0 || unset > 0 {
		list := strings.Join(skewed, ", ")
		if list == "" {
			list = "none listed"
		}
		row("devices", "%d with skewed clocks (%s); %d readings refused for a clock never set", m.SkewedDevices, list, unset)
	}
}

func printStatus(w io.Writer, st status) {
	m, k := st.MQTT, st.Kafka
	row := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-9s "+format+"\n", append([]any{name}, args...)...)
	}
	row("gateway", "%s (edgegate %s), up %s", st.Gateway, st.Version, st.Now.Sub(st.Started).Round(time.Second))
	dead := uint64(0)
	for _, n := range m.Rejected {
		dead += n
	}
	row("mqtt", "%d clients, %d publications, %d duplicates ignored, %d refused at the quota", m.Clients, m.Publishes, m.Duplicates, m.Refused)
	row("", "%d held at mqtt.receive_maximum, %d PUBACKs owed to closed connections, %d kept for duplicate detection",
		m.FlowHeld, m.AcksUndelivered, m.DuplicateEntries)
	var refused []string
	for _, r := range slices.Sorted(maps.Keys(m.MQTTRefused)) {
		if n := m.MQTTRefused[r]; n > 0 {
			refused = append(refused, fmt.Sprintf("%s %d", r, n))
		}
	}
	if len(refused) == 0 {
		refused = []string{"none"}
	}
	row("security", "refused: %s; %d publications throttled; %d sockets open", strings.Join(refused, ", "), m.Throttled, m.Sockets)
	row("readings", "%d aggregated, %d late revisions, %d too late, %d future, %d evicted, %d invalid, %d over the series limits, %d payloads refused",
		m.Outcomes["aggregated"], m.Outcomes["late_revised"], m.Outcomes["too_late"], m.Outcomes["future"],
		m.Outcomes["late_state_evicted"], m.Outcomes["invalid"], m.Outcomes["too_many_series"], dead)
	printClock(row, m)
	row("windows", "%d open, %d closed in memory, %d devices, %d summaries emitted", m.OpenWindows, m.Retained, m.Devices, m.Summaries)
	fg := st.Figures
	row("kafka", "link %s", fg.Link.Text)
	row("", "%d records queued (%.1f MiB, oldest %s), %d delivered in %d batches, %d dropped, %d lost, %d refused (set aside), %d connects, %d send errors",
		k.Queued, float64(k.QueueBytes)/(1<<20), k.OldestAge, k.Delivered, k.Batches, k.Dropped, k.Lost, k.Refused, k.Connects, k.SendErrors)
	row("drain", "%s", fg.Drain.Text)
	if r := fg.Rates; r.OverSeconds > 0 {
		row("rates", "%.1f readings/s in, %.1f summaries/s out, %.1f records/s delivered (%s)", r.ReadingsPerS, r.SummariesPerS, r.DeliveredPerS, r.Over)
	} else {
		row("rates", "none yet (the first after %s)", fmtAge(minRateSpan))
	}
	for _, w := range k.KafkaWarnings {
		row("warning", "%s", w)
	}
	h := m.Journal.FsyncLatency
	avg := 0.0
	if h.Count > 0 {
		avg = h.Sum / float64(h.Count) * 1000
	}
	row("journal", "%.1f MiB, checkpoint at %d of %d, %d fsyncs (mean %.2f ms), %d replayed at start",
		float64(m.Journal.Bytes)/(1<<20), m.Journal.Checkpoint, m.Journal.Applied, h.Count, avg, m.Journal.Replayed)
	printDevices(row, st)
	for _, s := range m.Sensors {
		state := "up"
		if !s.Up {
			state = "DOWN"
		}
		row("sensor", "%s as %s: %s, %d polls, %d errors %s", s.Sensor, s.Device, state, s.Polls, s.Errors, s.LastError)
	}
}

// printDevices prints the dead letters by reason and the devices, as the
// status page's table has them, up to maxPrintedDevices.
func printDevices(row func(name, format string, args ...any), st status) {
	m := st.MQTT
	var dead []string
	for _, r := range slices.Sorted(maps.Keys(m.DeadLetters)) {
		dead = append(dead, fmt.Sprintf("%s %d", r, m.DeadLetters[r]))
	}
	if len(dead) > 0 {
		row("dead", "letters by reason: %s", strings.Join(dead, ", "))
	}
	for i, d := range m.DeviceList {
		if i == maxPrintedDevices {
			row("", "and %d more devices (the status page and /metrics list them)", m.Devices-i)
			break
		}
		perMin := "no readings a minute yet"
		if f, ok := st.Figures.Devices[d.ID]; ok && f.ReadingsPerMin != nil {
			perMin = fmt.Sprintf("%.1f readings/min", *f.ReadingsPerMin)
			if over := time.Duration(f.OverSeconds * float64(time.Second)); overText(over) != "last minute" {
				perMin += " (" + overText(over) + ")"
			}
		}
		row("device", "%s: %s, %d readings, %d late revisions, %d too late, %d open windows, last seen %s ago",
			d.ID, perMin, d.Aggregated+d.Revised, d.Revised, d.TooLate, d.OpenWindows, fmtAge(st.Now.Sub(d.LastSeen)))
	}
}

// maxPrintedDevices bounds the devices `edgegate status` prints.
const maxPrintedDevices = 20
