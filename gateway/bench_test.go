package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/configs"
)

// countOutput counts what the gateway produces and throws it away.
type countOutput struct{ summaries, dead atomic.Uint64 }

func (c *countOutput) Summary(aggregate.Summary, bridge.Mark)    { c.summaries.Add(1) }
func (c *countOutput) DeadLetter(bridge.DeadLetter, bridge.Mark) { c.dead.Add(1) }
func (c *countOutput) Full() bool                                { return false }
func (c *countOutput) Stored() bridge.Mark                       { return bridge.Mark{} }
func (c *countOutput) Sync() error                               { return nil }

func benchGateway(b *testing.B, now func() time.Time) (*Gateway, *countOutput) {
	b.Helper()
	c := configs.Default()
	c.Gateway.ID = "bench"
	c.Gateway.DataDir = b.TempDir()
	c.MQTT.Listen = "127.0.0.1:0"
	c.MQTT.AllowAnonymous = true
	c.Kafka.Brokers = []string{"127.0.0.1:9"}
	out := &countOutput{}
	g, err := New(&c, out, slog.New(slog.NewTextHandler(io.Discard, nil)), now)
	if err != nil {
		b.Fatal(err)
	}
	return g, out
}

// BenchmarkIngest measures applying one journaled reading (record decode,
// payload decode, aggregate), as the journal's flusher runs it: 1,000
// devices x 10 metrics, one reading per metric per second of simulated
// time, windows closing as time advances. Journal writes are not included.
func BenchmarkIngest(b *testing.B) {
	const devices, metrics = 1000, 10
	topics := make([]string, devices*metrics)
	for d := range devices {
		for m := range metrics {
			topics[d*metrics+m] = fmt.Sprintf("sensors/dev-%04d/metric-%d", d, m)
		}
	}
	for _, form := range []string{"bare", "v+t"} {
		b.Run(form, func(b *testing.B) {
			start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
			var clock time.Time
			g, out := benchGateway(b, func() time.Time { return clock })
			defer g.server.Close()
			buf := make([]byte, 0, 64)
			rec := make([]byte, 0, 128)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				k := i % len(topics)
				// every topic once per simulated second
				clock = start.Add(time.Duration(i/len(topics))*time.Second + time.Duration(k)*time.Second/time.Duration(len(topics)))
				buf = buf[:0]
				if form == "bare" {
					buf = strconv.AppendFloat(buf, 20+float64(i%100)/10, 'f', 1, 64)
				} else {
					buf = append(buf, `{"v":`...)
					buf = strconv.AppendFloat(buf, 20+float64(i%100)/10, 'f', 1, 64)
					buf = append(buf, `,"t":`...)
					buf = strconv.AppendInt(buf, clock.UnixMilli(), 10)
					buf = append(buf, '}')
				}
				rec = appendPublish(rec[:0], clock.UnixNano(), 0, 0, "c", topics[k], buf)
				g.apply(uint64(i+1), [][]byte{rec})
				i++
			}
			b.StopTimer()
			if out.dead.Load() != 0 {
				b.Fatalf("%d readings dead-lettered", out.dead.Load())
			}
			b.ReportMetric(float64(out.summaries.Load())/float64(b.N), "summaries/reading")
		})
	}
}

// BenchmarkGatewayThroughput measures whole-gateway ingest over TCP: paho
// clients publishing to the real listener; readings/s is the figure. QoS 1
// keeps several publishes in flight per client.
func BenchmarkGatewayThroughput(b *testing.B) {
	for _, tc := range []struct {
		qos              byte
		clients, perConn int
	}{{0, 20, 1}, {1, 50, 32}} {
		b.Run(fmt.Sprintf("qos%d/clients=%d/inflight=%d", tc.qos, tc.clients, tc.perConn), func(b *testing.B) {
			g, _ := benchGateway(b, time.Now)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { g.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			clients := make([]*paho.Client, tc.clients)
			for i := range clients {
				conn, err := net.Dial("tcp", g.Addr())
				if err != nil {
					b.Fatal(err)
				}
				c := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: fmt.Sprintf("bench-%d", i)})
				if _, err := c.Connect(ctx, &paho.Connect{ClientID: fmt.Sprintf("bench-%d", i), KeepAlive: 60, CleanStart: true}); err != nil {
					b.Fatal(err)
				}
				clients[i] = c
				defer c.Disconnect(&paho.Disconnect{})
			}
			before := g.publishes.Load()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			workers := tc.clients * tc.perConn
			for w := range workers {
				n := b.N / workers
				if w < b.N%workers {
					n++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := clients[w%tc.clients]
					topic := fmt.Sprintf("sensors/dev-%d/m%d", w%tc.clients, w/tc.clients)
					for i := range n {
						p := &paho.Publish{Topic: topic, QoS: tc.qos, Payload: []byte(strconv.Itoa(i % 100))}
						if _, err := c.Publish(ctx, p); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for g.publishes.Load()-before < uint64(b.N) { // QoS 0 has no ack: wait until ingested
				if time.Since(start) > time.Minute {
					b.Fatalf("ingested %d of %d", g.publishes.Load()-before, b.N)
				}
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "readings/s")
		})
	}
}
