package kafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/bridge/kafka"
	"github.com/edgegate/edgegate/bridge/kafkatest"
)

// takeOver connects and takes over delivery, as the Forwarder does.
func takeOver(ctx context.Context, connect bridge.Connector) (bridge.Producer, error) {
	p, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.TakeOver(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// TestAbandonedConnectDoesNotFence: a take-over whose context ends while
// sarama initialises the transactional producer (InitProducerId) is
// abandoned, but the initialisation goes on in the background. Were the
// next take-over's InitProducerId handled first, the abandoned one would
// bump the epoch after it and fence the producer the Forwarder goes on
// with (ErrFenced, although no other gateway runs). kfake holds the first
// InitProducerId until the next take-over has had time to send its own.
func TestAbandonedConnectDoesNotFence(t *testing.T) {
	c, brokers := kafkatest.Start(t, 1, summaries, "edge.offsets")
	held, woke, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	second := make(chan struct{})
	var n atomic.Int32
	c.ControlKey(kmsg.InitProducerID.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		switch n.Add(1) {
		case 1:
			close(held)
			c.SleepControl(func() { <-release })
			close(woke) // kfake handles this request before reading any other
		case 2:
			close(second)
		}
		return nil, nil, false
	})
	connect := kafka.NewConnector(kafka.Options{Brokers: brokers, ClientID: "fence-test",
		TransactionalID: "fence-test", OffsetsTopic: "edge.offsets", PositionKey: "gw-1"})

	ctx1, cancel1 := context.WithCancel(context.Background())
	abandoned := make(chan error, 1)
	go func() {
		p, err := takeOver(ctx1, connect)
		if p != nil {
			p.Close()
		}
		abandoned <- err
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no InitProducerId")
	}
	cancel1()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned connect: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		p   bridge.Producer
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := takeOver(ctx, connect)
		got <- result{p, err}
	}()
	select { // the next connect must not overtake the abandoned one
	case <-second:
	case <-time.After(time.Second):
	}
	close(release)
	<-woke
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.p.Close()
	rec := bridge.Record{Topic: summaries, Key: []byte("gw-1/dev"), Value: []byte("{}")}
	if err := r.p.Send(ctx, []bridge.Record{rec}, bridge.Position{Queue: "q", Next: 1}); err != nil {
		t.Fatalf("send after an abandoned connect: %v", err)
	}
}
