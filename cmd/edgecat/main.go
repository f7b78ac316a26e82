// Command edgecat is for the people who consume edgegate's summaries
// from Kafka:
//
//	edgecat tail  [--from beginning|latest|TIME] [--gateway G] [--device D] [--metric M] [--json]
//	edgecat lag   --group G
//	edgecat check [--from ...] [--until TIME]
//	edgecat sink postgres --dsn DSN [--group G] [--init]
//
// Every command reads with isolation.level=read_committed unless told
// otherwise (--read-uncommitted).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/edgegate/edgegate/bridge/kafka"
)

const usage = `edgecat: read edgegate's summaries from Kafka

Usage:
  edgecat tail  [flags]           live table of summaries (--json for one JSON object per line)
  edgecat lag   --group G [flags] consumer-group lag per partition, and each gateway's freshness
  edgecat check [flags]           duplicates, order violations, gaps and revision chains in a range
  edgecat sink postgres [flags]   exactly-once upserts into PostgreSQL, as a consumer-group member

Run "edgecat COMMAND -h" for a command's flags.
`

// errFindings is check's way of saying it found defects (exit status 1).
var errFindings = errors.New("defects found")

func main() {
	// sarama's go-metrics meters tick in a goroutine that never stops;
	// edgecat reports what it needs itself.
	kafka.DisableMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "tail":
		err = cmdTail(ctx, args[1:], stdout, stderr)
	case "lag":
		err = cmdLag(ctx, args[1:], stdout, stderr)
	case "check":
		err = cmdCheck(ctx, args[1:], stdout, stderr)
	case "sink":
		if len(args) < 2 || args[1] != "postgres" {
			fmt.Fprintln(stderr, "edgecat: sink: the one sink is postgres: edgecat sink postgres -h")
			return 2
		}
		err = cmdSinkPostgres(ctx, args[2:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "edgecat: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errFindings):
		return 1
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "edgecat: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "edgecat: %v\n", err)
	return 1
}

type usageError struct{ error }

// kafkaFlags are the flags every command has.
type kafkaFlags struct {
	brokers         string
	topic           string
	readUncommitted bool
	clientID        string
}

func (k *kafkaFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.brokers, "brokers", envOr("EDGECAT_BROKERS", "127.0.0.1:9092"), "Kafka bootstrap brokers, comma-separated (env EDGECAT_BROKERS)")
	fs.StringVar(&k.topic, "topic", "edge.summaries", "summaries topic")
	fs.BoolVar(&k.readUncommitted, "read-uncommitted", false, "also read records of open and aborted transactions (default: read_committed)")
	fs.StringVar(&k.clientID, "client-id", "edgecat", "Kafka client id")
}

func (k *kafkaFlags) brokerList() []string { return strings.Split(k.brokers, ",") }

// config is the sarama configuration for reading.
func (k *kafkaFlags) config() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = k.clientID
	c.Version = sarama.V2_8_0_0
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	if k.readUncommitted {
		c.Consumer.IsolationLevel = sarama.ReadUncommitted
	}
	c.Consumer.Return.Errors = true
	c.Metadata.Retry.Max = 3
	c.Net.DialTimeout = 5 * time.Second
	return c
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}

// startOffsets resolves --from for each partition: "beginning", "latest",
// or an RFC 3339 time (the first record at or after it, by record time).
func startOffsets(client sarama.Client, topic string, parts []int32, from string) (map[int32]int64, error) {
	out := map[int32]int64{}
	var at int64
	switch from {
	case "beginning", "earliest", "":
		at = sarama.OffsetOldest
	case "latest", "end":
		at = sarama.OffsetNewest
	default:
		t, err := time.Parse(time.RFC3339Nano, from)
		if err != nil {
			return nil, usageError{fmt.Errorf("--from %q: use beginning, latest or an RFC 3339 time such as 2026-11-30T10:00:00Z", from)}
		}
		at = t.UnixMilli()
	}
	for _, p := range parts {
		if at == sarama.OffsetOldest || at == sarama.OffsetNewest {
			out[p] = at
			continue
		}
		off, err := client.GetOffset(topic, p, at)
		if err != nil {
			return nil, fmt.Errorf("offset of %s/%d at %s: %w", topic, p, from, err)
		}
		if off < 0 { // no record that late: start at the end
			off = sarama.OffsetNewest
		}
		out[p] = off
	}
	return out, nil
}
