package gateway_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
)

// countOutput counts what the gateway produces and throws it away.
type countOutput struct{ summaries, dead atomic.Uint64 }

func (c *countOutput) Summary(aggregate.Summary, gateway.Mark)     { c.summaries.Add(1) }
func (c *countOutput) DeadLetter(gateway.DeadLetter, gateway.Mark) { c.dead.Add(1) }
func (c *countOutput) Full() bool                                  { return false }
func (c *countOutput) Stored() gateway.Mark                        { return gateway.Mark{} }
func (c *countOutput) Sync() error                                 { return nil }

var fsyncInterval = flag.Duration("fsync-interval", -1, "benchmarks: storage.fsync_interval (default: the config default)")

func benchGateway(b *testing.B, now func() time.Time) (*gateway.Gateway, *countOutput) {
	b.Helper()
	c := configs.Default()
	if *fsyncInterval >= 0 {
		c.Storage.FsyncInterval = configs.Duration(*fsyncInterval)
	}
	c.Gateway.ID = "bench"
	c.Gateway.DataDir = b.TempDir()
	c.MQTT.Listen = "127.0.0.1:0"
	c.MQTT.AllowAnonymous = true
	c.MQTT.PublishRate = 0 // measure the broker, not the limit
	c.Kafka.Brokers = []string{"127.0.0.1:9"}
	out := &countOutput{}
	g, err := gateway.New(c.GatewayOptions(nil), out, slog.New(slog.NewTextHandler(io.Discard, nil)), now)
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
			defer g.CloseFiles()
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
				rec = journal.AppendPublish(rec[:0], clock.UnixNano(), 0, 0, "c", topics[k], buf)
				g.ApplyBatch(uint64(i+1), [][]byte{rec})
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
// clients publishing to the real listener, every reading journaled on disk
// (b.TempDir) and QoS 1 ones acknowledged only after their fsync. QoS 1
// keeps 32 publishes in flight per client. Figures: readings/s; for QoS 1
// the PUBACK latency (p50, p99), readings per fsync and journal bytes per
// reading. The rate=30000 case offers a fixed load (mosquitto's measured
// maximum on this machine) so that its latency is not queueing behind a
// saturated CPU.
func BenchmarkGatewayThroughput(b *testing.B) {
	for _, tc := range []struct {
		qos              byte
		clients, perConn int
		rate             int // offered readings/s over all clients; 0 is as fast as acknowledged
	}{{0, 20, 1, 0}, {1, 50, 32, 0}, {1, 50, 32, 30000}} {
		name := fmt.Sprintf("qos%d/clients=%d/inflight=%d", tc.qos, tc.clients, tc.perConn)
		if tc.rate > 0 {
			name += fmt.Sprintf("/rate=%d", tc.rate)
		}
		b.Run(name, func(b *testing.B) {
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
			before := g.Publishes()
			js0 := g.JournalLog().Stats()
			lat := make([][]time.Duration, tc.clients*tc.perConn)
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
					mine := make([]time.Duration, 0, n)
					defer func() { lat[w] = mine }()
					var every time.Duration
					if tc.rate > 0 {
						every = time.Duration(workers) * time.Second / time.Duration(tc.rate)
					}
					for i := range n {
						if every > 0 { // open loop: each worker on its own schedule, phases spread
							time.Sleep(time.Until(start.Add(time.Duration(i)*every + time.Duration(w)*every/time.Duration(workers))))
						}
						p := &paho.Publish{Topic: topic, QoS: tc.qos, Payload: []byte(strconv.Itoa(i % 100))}
						t0 := time.Now()
						if _, err := c.Publish(ctx, p); err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
				}()
			}
			wg.Wait()
			for g.Publishes()-before < uint64(b.N) { // QoS 0 has no ack: wait until ingested
				if time.Since(start) > time.Minute {
					b.Fatalf("ingested %d of %d", g.Publishes()-before, b.N)
				}
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "readings/s")
			js := g.JournalLog().Stats()
			b.ReportMetric(float64(js.Bytes-js0.Bytes)/float64(b.N), "journal-B/reading")
			if tc.qos > 0 {
				all := slices.Concat(lat...)
				slices.Sort(all)
				b.ReportMetric(float64(all[len(all)/2])/1e6, "p50-ms")
				b.ReportMetric(float64(all[len(all)*99/100])/1e6, "p99-ms")
				b.ReportMetric(float64(b.N)/float64(js.Syncs-js0.Syncs), "readings/fsync")
			}
		})
	}
}
