package firmwaresim_test

import (
	"context"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgegate/edgegate/aggregate"
	firmwaresim "github.com/edgegate/edgegate/firmware-sim"
	"github.com/edgegate/edgegate/gateway/payload"
)

// capture records every publication a real mochi broker receives.
type capture struct {
	mqtt.HookBase
	mu   sync.Mutex
	msgs []packets.Packet
}

func (c *capture) ID() string { return "capture" }
func (c *capture) Provides(b byte) bool {
	return b == mqtt.OnPublish || b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}
func (c *capture) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }
func (c *capture) OnACLCheck(*mqtt.Client, string, bool) bool              { return true }
func (c *capture) OnPublish(_ *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	c.mu.Lock()
	c.msgs = append(c.msgs, pk.Copy(false))
	c.mu.Unlock()
	return pk, nil
}

type readings struct{ got []aggregate.Reading }

func (r *readings) Reading(x aggregate.Reading) { r.got = append(r.got, x) }
func (r *readings) Reject(e *payload.Error)     { panic(e) }

// TestFleetWireMatchesTruth runs a fleet of every payload form against a
// real mochi listener and checks that what arrived on the wire decodes to
// exactly what the truth log says was sent and acknowledged.
func TestFleetWireMatchesTruth(t *testing.T) {
	cap := &capture{}
	b := startMochi(t, cap, false)
	defer b.Close()

	f := firmwaresim.NewFleet(b.Addr(), 8, "sim", 40*time.Millisecond, 1)
	f.OnError = func(dev string, err error) { t.Errorf("%s: %v", dev, err) }
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	f.Run(ctx)

	truth := f.Truth.Sent()
	if len(truth) < 8*3*5 {
		t.Fatalf("only %d readings sent", len(truth))
	}
	dec, err := payload.NewDecoder([]string{"sensors/{device}/{metric}", "sensors/{device}"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var r readings
	cap.mu.Lock()
	for _, pk := range cap.msgs {
		if _, err := dec.Decode(pk.TopicName, pk.Payload, time.Time{}, &r); err != nil {
			t.Errorf("%s %q: %v", pk.TopicName, pk.Payload, err)
		}
		if pk.FixedHeader.Qos != 1 {
			t.Errorf("%s sent at QoS %d", pk.TopicName, pk.FixedHeader.Qos)
		}
	}
	cap.mu.Unlock()
	// Per device, the wire order equals the truth order; every acknowledged
	// reading arrived with the recorded value and (except the bare form,
	// which carries no time) the recorded event time.
	byDev := map[string][]aggregate.Reading{}
	for _, x := range r.got {
		byDev[x.Device] = append(byDev[x.Device], x)
	}
	seen := map[string]int{}
	forms := map[firmwaresim.Form]bool{}
	for _, d := range f.Devices {
		forms[d.Form] = true
	}
	for _, s := range truth {
		if !s.Acked {
			t.Errorf("not acknowledged: %+v", s)
			continue
		}
		i := seen[s.Device]
		seen[s.Device]++
		got := byDev[s.Device]
		if i >= len(got) {
			t.Fatalf("%s: truth has more readings than the wire", s.Device)
		}
		g := got[i]
		if g.Metric != s.Metric || g.Value != s.Value {
			t.Errorf("%s #%d: wire %s=%v, truth %s=%v", s.Device, i, g.Metric, g.Value, s.Metric, s.Value)
		}
		if !g.Time.IsZero() && !g.Time.Equal(s.Time) {
			t.Errorf("%s #%d: wire time %v, truth %v", s.Device, i, g.Time, s.Time)
		}
	}
	for dev, n := range seen {
		if len(byDev[dev]) != n {
			t.Errorf("%s: %d on the wire, %d in the truth log", dev, len(byDev[dev]), n)
		}
	}
	if len(forms) != 4 {
		t.Errorf("fleet used forms %v, want all four", forms)
	}
}
