package gateway

import (
	"github.com/edgegate/edgegate/bridge/queue"
	"github.com/edgegate/edgegate/gateway/journal"
)

// What the benchmarks in package gateway_test reach inside a Gateway.

func (g *Gateway) ApplyBatch(first uint64, recs [][]byte) { g.apply(first, recs) }
func (g *Gateway) WriteCheckpoint() error                 { return g.checkpoint() }
func (g *Gateway) JournalLog() *queue.Log                 { return g.jlog }
func (g *Gateway) State() *journal.StateDB                { return g.state }
func (g *Gateway) Publishes() uint64                      { return g.publishes.Load() }
func (g *Gateway) Replayed() uint64                       { return g.replayed.Load() }

// Tick journals an idle-close tick and waits until it is durable.
func (g *Gateway) Tick() error {
	b, err := g.j.Clock(journal.KindTick)
	if err != nil {
		return err
	}
	return b.Wait()

}

// TicksApplied returns the number of ticks applied.
func (g *Gateway) TicksApplied() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ticks
}

// CloseFiles closes the journal and state file and the broker's listeners
// of a gateway that was never run.
func (g *Gateway) CloseFiles() {
	g.closeFiles()
	g.broker.Close()
}
