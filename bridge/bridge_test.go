package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

const (
	summaries = "edge.summaries"
	dead      = "edge.deadletter"
)

func run(t *testing.T, f *bridge.Forwarder) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() { defer wg.Done(); err = f.Run(ctx) }()
	return func() error { cancel(); wg.Wait(); return err }
}

func summary(dev string, minute int) aggregate.Summary {
	start := time.Date(2026, 11, 30, 10, minute, 0, 0, time.UTC)
	s := aggregate.Summary{Gateway: "gw-1", Device: dev, Metric: "temp", WindowStart: start, WindowEnd: start.Add(time.Minute),
		Count: int64(minute + 1), Min: 1, Max: 2, Sum: 3, Mean: 1.5, First: 1, Last: 2}
	s.ID = aggregate.SummaryID(s.Gateway, s.Device, s.Metric, s.WindowStart, 0)
	return s
}

// TestDeliversInOrderPerDevice sends 40 windows of 25 devices through the
// forwarder into kfake (4 partitions) and reads them back with a
// read_committed consumer: every summary exactly as sent, headers set, and
// each device's windows on one partition in order.
func TestDeliversInOrderPerDevice(t *testing.T) {
	_, addrs := kafkatest.Start(t, 4, summaries, dead)
	f := bridge.NewForwarder(bridge.Options{Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead, BatchSize: 64},
		bridge.NewKafkaConnector(bridge.KafkaOptions{Brokers: addrs, ClientID: "test"}))
	stop := run(t, f)
	const devices, minutes = 25, 40
	sent := map[string]aggregate.Summary{}
	for m := 0; m < minutes; m++ {
		for d := 0; d < devices; d++ {
			s := summary(fmt.Sprintf("dev-%02d", d), m)
			sent[s.ID] = s
			f.Summary(s)
		}
	}
	f.DeadLetter(bridge.DeadLetter{Reason: "invalid_json", Detail: "x", Source: "mqtt", Topic: "sensors/a", Device: "a", Payload: []byte{0xff, 'x'}, ReceivedAt: time.Unix(0, 0)})
	msgs := kafkatest.Consume(t, addrs, summaries, devices*minutes, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(msgs) != devices*minutes {
		t.Fatalf("read %d summaries, want %d", len(msgs), devices*minutes)
	}
	partOf := map[string]int32{}
	lastMinute := map[string]int{}
	for _, m := range msgs {
		var s aggregate.Summary
		if err := json.Unmarshal(m.Value, &s); err != nil {
			t.Fatalf("value %s: %v", m.Value, err)
		}
		want, ok := sent[s.ID]
		if !ok || s != want {
			t.Fatalf("got %+v, sent %+v", s, want)
		}
		delete(sent, s.ID)
		if string(m.Key) != "gw-1/"+s.Device {
			t.Errorf("key %q", m.Key)
		}
		if p, ok := partOf[s.Device]; ok && p != m.Partition {
			t.Errorf("device %s on partitions %d and %d", s.Device, p, m.Partition)
		}
		partOf[s.Device] = m.Partition
		if last, ok := lastMinute[s.Device]; ok && s.WindowStart.Minute() != last+1 {
			t.Errorf("device %s: window %d after %d", s.Device, s.WindowStart.Minute(), last)
		}
		lastMinute[s.Device] = s.WindowStart.Minute()
		h := map[string]string{}
		for _, rh := range m.Headers {
			h[string(rh.Key)] = string(rh.Value)
		}
		if h["edgegate-gateway"] != "gw-1" || h["edgegate-schema-version"] != strconv.Itoa(aggregate.SchemaVersion) || h["content-type"] != "application/json" {
			t.Errorf("headers %v", h)
		}
	}
	dl := kafkatest.Consume(t, addrs, dead, 1, 10*time.Second)
	var got map[string]any
	if err := json.Unmarshal(dl[0].Value, &got); err != nil {
		t.Fatalf("dead letter %s: %v", dl[0].Value, err)
	}
	if got["reason"] != "invalid_json" || got["payload_base64"] != "/3g=" || got["device"] != "a" || got["gateway"] != "gw-1" {
		t.Errorf("dead letter = %s", dl[0].Value)
	}
	if st := f.Stats(); st.Delivered != devices*minutes+1 || st.Dropped != 0 || st.Buffered != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestBuffersWhileDownDropsOldest starts with no broker: the forwarder
// buffers, drops the oldest beyond its bound (counted), and delivers the
// rest once the broker comes up.
func TestBuffersWhileDownDropsOldest(t *testing.T) {
	port := kafkatest.FreePort(t)
	addr := kafkatest.Addr(port)
	f := bridge.NewForwarder(bridge.Options{Gateway: "gw-1", SummariesTopic: summaries, DeadletterTopic: dead, Buffer: 10,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		bridge.NewKafkaConnector(bridge.KafkaOptions{Brokers: []string{addr}, ClientID: "test"}))
	for m := 0; m < 25; m++ {
		f.Summary(summary("d", m))
	}
	stop := run(t, f)
	time.Sleep(300 * time.Millisecond) // a few failed connects
	if st := f.Stats(); st.LinkUp || st.Buffered != 10 || st.Dropped != 15 {
		t.Fatalf("while down: %+v", st)
	}
	kafkatest.StartOnPort(t, port, 1, summaries, dead)
	msgs := kafkatest.Consume(t, []string{addr}, summaries, 10, 20*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 10 {
		t.Fatalf("got %d, want 10", len(msgs))
	}
	for i, m := range msgs {
		var s aggregate.Summary
		json.Unmarshal(m.Value, &s)
		if s.WindowStart.Minute() != 15+i {
			t.Errorf("record %d is minute %d, want %d (the newest 10 survive)", i, s.WindowStart.Minute(), 15+i)
		}
	}
}
