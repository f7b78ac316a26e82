package gateway_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
	packets3 "github.com/eclipse/paho.mqtt.golang/packets"
	"periph.io/x/conn/v3/i2c/i2creg"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
)

// recordOutput keeps, across restarts of the gateway, the latest revision
// of each window's summary: the whole truth of its readings.
type recordOutput struct {
	mu     sync.Mutex
	latest map[string]aggregate.Summary
	mark   gateway.Mark
}

func (o *recordOutput) Summary(s aggregate.Summary, m gateway.Mark) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.latest == nil {
		o.latest = map[string]aggregate.Summary{}
	}
	k := s.Device + "/" + s.Metric + "/" + s.WindowStart.String()
	if old, ok := o.latest[k]; !ok || s.Revision >= old.Revision {
		o.latest[k] = s
	}
	o.mark = m
}

func (o *recordOutput) DeadLetter(_ gateway.DeadLetter, m gateway.Mark) {
	o.mu.Lock()
	o.mark = m
	o.mu.Unlock()
}
func (o *recordOutput) Full() bool { return false }
func (o *recordOutput) Stored() gateway.Mark {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mark
}
func (o *recordOutput) Sync() error { return nil }

// counted returns the readings the summaries of device count.
func (o *recordOutput) counted(device string) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n int64
	for _, s := range o.latest {
		if s.Device == device {
			n += s.Count
		}
	}
	return n
}

// ackedStore is paho.mqtt.golang's memory store that notes which
// publications were acknowledged: the client puts each in the store before
// it first sends it and deletes it when its PUBACK comes. (The client's
// tokens cannot tell: one resent after a reconnect is completed, without
// an error, when the resend claims its packet id.)
type ackedStore struct {
	*mqtt3.MemoryStore
	mu     sync.Mutex
	stored map[string]string // key → payload
	acked  map[string]int    // payload → PUBACKs
	over   int               // publications overwritten in the store before their PUBACK
}

func newAckedStore() *ackedStore {
	return &ackedStore{MemoryStore: mqtt3.NewMemoryStore(), stored: map[string]string{}, acked: map[string]int{}}
}

func (s *ackedStore) Put(key string, m packets3.ControlPacket) {
	if p, ok := m.(*packets3.PublishPacket); ok {
		s.mu.Lock()
		if _, ok := s.stored[key]; ok {
			s.over++
		}
		s.stored[key] = string(p.Payload)
		s.mu.Unlock()
	}
	s.MemoryStore.Put(key, m)
}

func (s *ackedStore) Del(key string) {
	s.mu.Lock()
	if p, ok := s.stored[key]; ok {
		s.acked[p]++
		delete(s.stored, key)
	}
	s.mu.Unlock()
	s.MemoryStore.Del(key)
}

// freeAddr returns a loopback address with a port free now, so that a
// gateway restarted on it is found by clients that reconnect.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// recorded runs a gateway on cfg, into out, that a test stops and
// starts again on the same data directory and address.
type recorded struct {
	t    *testing.T
	cfg  *configs.Config
	out  *recordOutput
	gw   *gateway.Gateway
	stop func()
}

func (r *recorded) start() {
	r.t.Helper()
	gw, err := gateway.New(r.cfg.GatewayOptions(i2creg.Open), r.out, quietLog(), time.Now)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	r.gw = gw
	r.stop = func() {
		cancel()
		if err := <-done; err != nil {
			r.t.Errorf("gateway: %v", err)
		}
	}
}

// TestBacklogWithoutWindow: Eclipse paho.mqtt.golang (MQTT 3.1.1, a
// persistent session, auto-reconnect), the most used Go client, sends its
// QoS 1 backlog without a window and resends everything unacknowledged
// with DUP after a reconnect. 2,000 readings of 1 sent at once, with the
// gateway restarted twice while they are in flight: every one is
// acknowledged, none disconnects it for having too many in flight, and
// the summaries count each exactly once. (Before flow control, the gateway
// disconnected it at 257 in flight and its duplicate detection had
// forgotten the earliest when they came back: 2,570 to 3,966 counted for
// 1,000.)
func TestBacklogWithoutWindow(t *testing.T) {
	const n, device = 2000, "backlog-1"
	cfg := testConfig(t, []string{"127.0.0.1:9"})
	cfg.MQTT.Listen = freeAddr(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := &recorded{t: t, cfg: cfg, out: &recordOutput{}}
	r.start()

	var lost atomic.Int32
	store := newAckedStore()
	opts := mqtt3.NewClientOptions().AddBroker("tcp://" + cfg.MQTT.Listen).SetClientID(device).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(50 * time.Millisecond).SetMaxReconnectInterval(100 * time.Millisecond).
		SetConnectionLostHandler(func(mqtt3.Client, error) { lost.Add(1) }).SetStore(store)
	c := mqtt3.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(patience) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	toks := make([]mqtt3.Token, n)
	for i := range toks {
		toks[i] = c.Publish("sensors/"+device+"/t", 1, false, strconv.Itoa(i))
	}
	// Restart while the backlog is in flight: once some are counted, and
	// again once more are.
	for range 2 {
		settled(t, r.gw, func(st gateway.Stats) bool { return st.Publishes >= n/4 })
		st := r.gw.Stats()
		t.Logf("restart: publications %d, aggregated %d, late %d, duplicates %d", st.Publishes, st.Outcomes["aggregated"], st.Outcomes["late_revised"], st.Duplicates)
		r.stop()
		r.start()
	}
	// Every publication acknowledged: the store empty, each one's PUBACK
	// received.
	deadline := time.Now().Add(2 * patience)
	for {
		store.mu.Lock()
		acked, left := len(store.acked), len(store.stored)
		store.mu.Unlock()
		if acked == n && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d of %d publications acknowledged, %d waiting in the client's store", 2*patience, acked, n, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Disconnect(100)
	store.mu.Lock()
	twice := 0
	for _, k := range store.acked {
		if k > 1 {
			twice++
		}
	}
	t.Logf("client: %d acknowledged, %d twice (resent after their PUBACK was received), %d overwritten", len(store.acked), twice, store.over)
	store.mu.Unlock()
	st := r.gw.Stats()
	r.stop() // closes the open windows
	if got := r.out.counted(device); got != n {
		t.Errorf("summaries count %d readings; %d acknowledged", got, n)
	}
	if st.MQTTRefused["receive_maximum"] != 0 {
		t.Errorf("receive_maximum refusals %d, want 0", st.MQTTRefused["receive_maximum"])
	}
	t.Logf("outcomes %v", st.Outcomes)
	t.Logf("connections lost %d; last run: held %d, duplicates %d, undelivered PUBACKs %d", lost.Load(), st.FlowHeld, st.Duplicates, st.AcksUndelivered)
}
