// Package journal is the gateway's ingest journal and the state it is
// replayed into.
//
// Every event that changes the gateway's state (a publication, the
// idle-close tick, the shutdown flush, a persistent session beginning or
// ending, a subscription, a PUBREL) is an Event record in a queue.Log (the
// same segmented, CRC-framed log as the outbound queue; see
// bridge/queue/FORMAT.md). The Journal appends them with group commit: one
// fsync covers every event that came while the previous one ran, and only
// then are the batch's PUBACKs sent (through the Ack function) and the
// batch handed to the applier, in journal order. JOURNAL.md gives the
// record layout.
//
// The rest of the package is what replay needs: the Checkpoint codec, the
// duplicate detection that a checkpoint keeps (Dedupe), and the state
// file (StateDB: the latest checkpoint and the closed windows kept for
// late revisions, in bbolt).
package journal
