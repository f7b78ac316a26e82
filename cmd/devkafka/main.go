// Command devkafka runs an in-memory Kafka-protocol broker (franz-go's kfake)
// for development and the end-to-end tests, so that the gateway, kcat and
// sarama consumers can talk to a Kafka that outlives any one of them. It is
// not a production broker: data lives in memory.
//
//	devkafka --port 9092 --topics edge.summaries,edge.deadletter,edge.offsets --partitions 3
//
// Topics whose name ends in ".offsets" are created compacted, as the
// gateway wants its offsets topic. It prints "kafka listening on
// HOST:PORT" once ready and runs until interrupted.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 9092, "port to listen on (0 picks one)")
	topics := flag.String("topics", "edge.summaries,edge.deadletter,edge.offsets", "comma-separated topics to create")
	partitions := flag.Int("partitions", 3, "partitions per topic")
	flag.Parse()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(*port), kfake.AllowAutoTopicCreation())
	if err != nil {
		fmt.Fprintf(os.Stderr, "devkafka: %v\n", err)
		os.Exit(1)
	}
	if *topics != "" {
		for _, t := range strings.Split(*topics, ",") {
			// The gateway's offsets topic is compacted, as it refuses
			// one that is not.
			var cfg map[string]string
			if strings.HasSuffix(t, ".offsets") {
				cfg = map[string]string{"cleanup.policy": "compact"}
			}
			if err := c.CreateTopic(t, int32(*partitions), cfg); err != nil {
				fmt.Fprintf(os.Stderr, "devkafka: create topic %s: %v\n", t, err)
				os.Exit(1)
			}
		}
	}
	fmt.Printf("kafka listening on %s\n", c.ListenAddrs()[0])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	c.Close()
}
