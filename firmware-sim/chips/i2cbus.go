package chips

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"periph.io/x/conn/v3/physic"
)

// Chip is a register-level model of an I²C chip on a Bus. Tx is one bus
// transaction addressed to it: bytes written, then (after a repeated start)
// len(r) bytes read.
type Chip interface {
	Tx(w, r []byte) error
	// Name identifies the model in errors and scans.
	Name() string
}

// ErrNACK is the error of a transaction that no chip acknowledged.
var ErrNACK = errors.New("i2c: no acknowledge")

// ErrShortRead is the error of a read that ended early (the chip released
// the bus, or the adapter gave up), as Linux's i2c-dev reports one.
var ErrShortRead = errors.New("i2c: short read")

// ErrStuck is the error of every transaction while the bus is stuck (a
// chip holding SDA low).
var ErrStuck = errors.New("i2c: bus stuck (SDA held low)")

// Bus is an emulated I²C bus implementing periph's i2c.Bus (and
// i2c.BusCloser), with chips attached at addresses. It counts transactions
// and bytes, and can be made to fail.
type Bus struct {
	name string

	mu    sync.Mutex
	chips map[uint16]Chip
	stuck bool
	short int // reads to cut short
	txs   int
	bytes int
}

// NewBus returns an empty bus.
func NewBus(name string) *Bus { return &Bus{name: name, chips: map[uint16]Chip{}} }

// Attach puts c at addr (7-bit).
func (b *Bus) Attach(addr uint16, c Chip) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chips[addr] = c
}

// Detach removes the chip at addr: it stops acknowledging.
func (b *Bus) Detach(addr uint16) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.chips, addr)
}

// Addrs returns the addresses with a chip, in order.
func (b *Bus) Addrs() []uint16 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var a []uint16
	for addr := range b.chips {
		a = append(a, addr)
	}
	sort.Slice(a, func(i, j int) bool { return a[i] < a[j] })
	return a
}

// SetStuck makes every transaction fail with ErrStuck until cleared.
func (b *Bus) SetStuck(stuck bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stuck = stuck
}

// FailShortRead makes the next n reads deliver only half their bytes and
// fail with ErrShortRead.
func (b *Bus) FailShortRead(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.short = n
}

// Counts returns the transactions made and the bytes moved (written and
// read, addresses not counted) so far.
func (b *Bus) Counts() (txs, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.txs, b.bytes
}

// Tx implements i2c.Bus.
func (b *Bus) Tx(addr uint16, w, r []byte) error {
	b.mu.Lock()
	c, ok := b.chips[addr]
	stuck := b.stuck
	short := len(r) > 1 && b.short > 0
	if short {
		b.short--
	}
	b.txs++
	b.bytes += len(w) + len(r)
	b.mu.Unlock()
	if stuck {
		return ErrStuck
	}
	if !ok {
		return fmt.Errorf("%w at address %#02x on %s", ErrNACK, addr, b.name)
	}
	if short {
		full := make([]byte, len(r))
		if err := c.Tx(w, full); err != nil {
			return err
		}
		clear(r)
		copy(r, full[:len(r)/2])
		return fmt.Errorf("%w: got %d of %d bytes from %#02x", ErrShortRead, len(r)/2, len(r), addr)
	}
	return c.Tx(w, r)
}

// SetSpeed implements i2c.Bus; an emulated bus runs at any speed.
func (b *Bus) SetSpeed(physic.Frequency) error { return nil }

// String implements i2c.Bus.
func (b *Bus) String() string { return b.name }

// Close implements i2c.BusCloser. The bus stays usable: several users
// may open it by name.
func (b *Bus) Close() error { return nil }

// Counters of the chips, for tests that need to know how many
// measurements were made.
func (c *BME280) Count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.Conversions }
func (c *SHT3x) Count() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.Measurements }
func (c *BH1750) Count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.Measurements }

// faults are what a chip model can be told to do wrong on its next
// transactions.
type faults struct {
	nack int // transactions not acknowledged
	busy int // extra status reads that say "converting" (slow conversion)
}

// FailNACK makes the chip ignore its next n transactions.
func (f *faults) FailNACK(n int) { f.nack = n }

// FailBusy makes the chip's next conversion take n more status polls
// (BME280) or n more NACKed reads (SHT3x, BH1750) than it should.
func (f *faults) FailBusy(n int) { f.busy = n }

func (f *faults) takeNACK() bool {
	if f.nack > 0 {
		f.nack--
		return true
	}
	return false
}
