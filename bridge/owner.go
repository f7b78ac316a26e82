package bridge

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgegate/edgegate/bridge/queue"
)

// AdoptFile is the file in the outbound queue's directory (Options.Dir)
// that lets this gateway take over a delivered position Kafka holds for
// its gateway id although another outbound queue wrote it (or this queue,
// further than it reaches): a gateway whose data directory was replaced
// on purpose, or restored from an older copy. The Forwarder then delivers
// from its own local position and removes the file once its first batch
// is committed (Kafka's position is then its own). Create it (empty) only
// when no other gateway runs with this gateway id.
const AdoptFile = "adopt"

// SharedIDError is what Run returns when the delivered position Kafka
// holds for this gateway id was written by another outbound queue: two
// gateways run with the same id (a copied configuration, cloned SD
// cards), or this one's data directory was replaced. Run checks it before
// taking over delivery, so the gateway that wrote the position goes on
// undisturbed. Both would otherwise fence each other in turn, and their
// summaries would share ids and keys.
type SharedIDError struct {
	Gateway string   // the gateway id
	Queue   string   // this gateway's outbound queue
	Kafka   Position // the position Kafka holds, written by another queue
	Adopt   string   // the path of the AdoptFile that takes the position over
}

func (e *SharedIDError) Error() string {
	return fmt.Sprintf("two gateways share gateway.id %q: Kafka's delivered position for it was written by another outbound queue "+
		"(%s%s), not this gateway's (%s). Give each gateway its own gateway.id (or leave it unset: each gateway then makes its own). "+
		"If this gateway replaces the one that wrote the position and that one no longer runs (this data directory was wiped or replaced on purpose), "+
		"create %s and start it again: it takes over the id, delivering from its own queue",
		e.Gateway, e.Kafka.Queue, writtenBy(e.Kafka), e.Queue, e.Adopt)
}

// CopyError is what Run returns when Kafka holds a delivered position of
// this gateway's own outbound queue beyond the records the queue has
// ever held: the data directory is an older copy of itself (restored from
// a backup, or a card cloned from this gateway while a copy runs on),
// or its tail was lost. The queue numbers its records again from where
// it ends, and Kafka's position would pass the new ones off as delivered.
type CopyError struct {
	Queue string   // the outbound queue
	End   uint64   // the sequence number the queue's next record gets
	Kafka Position // the position Kafka holds for it
	Adopt string   // the path of the AdoptFile
}

func (e *CopyError) Error() string {
	return fmt.Sprintf("kafka's delivered position for this gateway's outbound queue %s is %d (%s), beyond the %d records the queue holds: "+
		"this data directory is an older copy (restored from a backup, or the card was cloned from this gateway), and records from %d on would be taken for delivered. "+
		"If a copy of this card runs on another gateway, give that one its own gateway.id and an empty data directory; "+
		"otherwise create %s and start again: this gateway then delivers from its own position",
		e.Queue, e.Kafka.Next, writtenBy(e.Kafka)[2:], e.End-1, e.End, e.Adopt)
}

// writtenBy says where and when a position read from Kafka was written:
// ", on host h, 3m0s ago" (each part when known).
func writtenBy(p Position) string {
	s := ""
	if p.Host != "" {
		s += ", on host " + p.Host
	}
	if !p.At.IsZero() {
		s += fmt.Sprintf(", written %v ago", time.Since(p.At).Round(time.Second))
	}
	if s == "" {
		s = ", where and when unknown"
	}
	return s
}

// checkOwner checks that the position Kafka holds (if found) is this
// queue's and within it, unless this gateway adopts it (AdoptFile).
func (f *Forwarder) checkOwner(kp Position, found bool) error {
	if !found || f.adopting {
		return nil
	}
	adopt := filepath.Join(f.opts.Dir, AdoptFile)
	switch kp.Queue {
	case f.q.ID():
		end := f.openNext // at the first connection, only records recovered at open can have been delivered
		if f.owned {
			end = f.q.Stats().Next
		}
		if kp.Next > end {
			return &CopyError{Queue: kp.Queue, End: end, Kafka: kp, Adopt: adopt}
		}
		f.owned = true
	case "":
		// A record that names no queue (written by hand, or by a tool):
		// nothing to check it against; the local position counts (see
		// reconcile).
	default:
		return &SharedIDError{Gateway: f.opts.Gateway, Queue: f.q.ID(), Kafka: kp, Adopt: adopt}
	}
	return nil
}

// adopted ends the adoption after the first committed batch: Kafka's
// position is now this queue's.
func (f *Forwarder) adopted() error {
	f.adopting, f.owned = false, true
	if err := os.Remove(filepath.Join(f.opts.Dir, AdoptFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", AdoptFile, err)
	}
	if err := queue.SyncDir(f.opts.Dir); err != nil {
		return err
	}
	f.log.Warn("gateway id taken over: Kafka's delivered position is this gateway's queue's now", "queue", f.q.ID(), "gateway", f.opts.Gateway)
	return nil
}
