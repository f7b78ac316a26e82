package gateway_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/configs"
	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/journal"
	"github.com/edgegate/edgegate/gateway/payload"
)

// countOutput counts what the gateway produces and throws it away.
type countOutput struct {
	summaries, dead atomic.Uint64
	first           string // the first dead letter's reason and detail
}

func (c *countOutput) Summary(aggregate.Summary, gateway.Mark) { c.summaries.Add(1) }
func (c *countOutput) DeadLetter(d gateway.DeadLetter, _ gateway.Mark) {
	if c.dead.Add(1) == 1 {
		c.first = d.Reason + ": " + d.Detail
	}
}
func (c *countOutput) Full() bool           { return false }
func (c *countOutput) Stored() gateway.Mark { return gateway.Mark{} }
func (c *countOutput) Sync() error          { return nil }

var fsyncInterval = flag.Duration("fsync-interval", -1, "benchmarks: storage.fsync_interval (default: the config default)")

func benchGateway(b *testing.B, now func() time.Time) (*gateway.Gateway, *countOutput) {
	b.Helper()
	return benchGatewayWith(b, now, nil)
}

// benchGatewayWith is benchGateway with the configuration changed by edit.
func benchGatewayWith(b *testing.B, now func() time.Time, edit func(*configs.Config)) (*gateway.Gateway, *countOutput) {
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
	if edit != nil {
		edit(&c)
	}
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

// BenchmarkIngestMessage compares payload forms that carry 10 metrics per
// message on the same load, applied as BenchmarkIngest applies readings:
// 1,000 devices (for Sparkplug, 100 edge nodes of 10 devices each, born
// before the timer starts) × 10 metrics, one message per device per second
// of simulated time. object is the JSON object {"t":..,"metric-0":..};
// sparkplug is a DDATA with the 10 metrics by alias, a metric timestamp
// each and the node's seq. Figures: readings/s (one core: the applier is
// one goroutine) and CPU time per reading (getrusage, user + system).
func BenchmarkIngestMessage(b *testing.B) {
	const nodes, perNode, metrics = 100, 10, 10
	const devices = nodes * perNode
	for _, form := range []string{"object", "sparkplug"} {
		b.Run(form, func(b *testing.B) {
			start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
			var clock time.Time
			g, out := benchGatewayWith(b, func() time.Time { return clock }, func(c *configs.Config) { c.Sparkplug.Enabled = true })
			defer g.CloseFiles()
			topics := make([]string, devices)
			seq := make([]int, nodes)
			var body, rec []byte
			seqNo := uint64(0)
			apply := func(topic string, payload []byte) {
				seqNo++
				rec = journal.AppendPublish(rec[:0], clock.UnixNano(), 0, 0, "c", topic, payload)
				g.ApplyBatch(seqNo, [][]byte{rec})
			}
			for d := range devices {
				if form == "object" {
					topics[d] = fmt.Sprintf("sensors/dev-%04d", d)
					continue
				}
				node, dev := d/perNode, d%perNode
				topics[d] = fmt.Sprintf("spBv1.0/bench/DDATA/node-%03d/dev-%d", node, dev)
				clock = start
				if dev == 0 {
					body = payload.AppendSparkplug(body[:0], uint64(start.UnixMilli()), 0,
						[]payload.SparkplugOut{{Name: "bdSeq", Datatype: payload.SpUInt64, Kind: payload.SpLongValue}})
					apply(fmt.Sprintf("spBv1.0/bench/NBIRTH/node-%03d", node), body)
					seq[node] = 1
				}
				var defs []payload.SparkplugOut
				for m := range metrics {
					defs = append(defs, payload.SparkplugOut{Name: fmt.Sprintf("metric-%d", m), Alias: uint64(dev*metrics + m), HasAlias: true,
						Datatype: payload.SpDouble, IsNull: true})
				}
				body = payload.AppendSparkplug(body[:0], uint64(start.UnixMilli()), seq[node], defs)
				apply(fmt.Sprintf("spBv1.0/bench/DBIRTH/node-%03d/dev-%d", node, dev), body)
				seq[node]++
			}
			if st := g.Stats().Sparkplug; form == "sparkplug" && (st.DevicesOnline != devices || st.NodesOnline != nodes) {
				b.Fatalf("births not applied: %+v", *st)
			}
			// The messages are encoded (and journal records made) before
			// the timer starts: only applying them is measured.
			ms := make([]payload.SparkplugOut, metrics)
			recs := make([][]byte, b.N)
			for i := range b.N {
				d := i % devices
				clock = start.Add(time.Second + time.Duration(i/devices)*time.Second + time.Duration(d)*time.Second/devices)
				v := 20 + float64(i%100)/10
				if form == "object" {
					body = append(body[:0], `{"t":`...)
					body = strconv.AppendInt(body, clock.UnixMilli(), 10)
					for m := range metrics {
						body = append(body, `,"metric-`...)
						body = strconv.AppendInt(body, int64(m), 10)
						body = append(body, `":`...)
						body = strconv.AppendFloat(body, v+float64(m), 'f', 1, 64)
					}
					body = append(body, '}')
				} else {
					node, dev := d/perNode, d%perNode
					for m := range ms {
						ms[m] = payload.SparkplugOut{Alias: uint64(dev*metrics + m), HasAlias: true, Timestamp: uint64(clock.UnixMilli()),
							Kind: payload.SpDoubleValue, Bits: math.Float64bits(v + float64(m))}
					}
					body = payload.AppendSparkplug(body[:0], uint64(clock.UnixMilli()), seq[node], ms)
					seq[node] = (seq[node] + 1) % 256
				}
				recs[i] = journal.AppendPublish(nil, clock.UnixNano(), 0, 0, "c", topics[d], body)
			}
			var ru0, ru1 syscall.Rusage
			b.ReportAllocs()
			b.ResetTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			for i := range b.N {
				g.ApplyBatch(seqNo+uint64(i)+1, recs[i:i+1])
			}
			b.StopTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			if out.dead.Load() != 0 {
				b.Fatalf("%d publications dead-lettered, the first: %s", out.dead.Load(), out.first)
			}
			readings := float64(b.N * metrics)
			cpu := time.Duration(ru1.Utime.Nano() - ru0.Utime.Nano() + ru1.Stime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(readings/b.Elapsed().Seconds(), "readings/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/readings, "ns/reading")
			b.ReportMetric(float64(cpu.Nanoseconds())/readings, "cpu-ns/reading")
			b.ReportMetric(float64(out.summaries.Load())/readings, "summaries/reading")
		})
	}
}
