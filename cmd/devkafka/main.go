// Command devkafka runs an in-memory Kafka-protocol broker (franz-go's kfake)
// for development and the end-to-end tests, so that the gateway, kcat and
// sarama consumers can talk to a Kafka that outlives any one of them. It is
// not a production broker: data lives in memory.
//
//	devkafka --port 9092 --topics edge.summaries,edge.deadletter,edge.offsets --partitions 3
//
// It prints "kafka listening on HOST:PORT" once ready and runs until
// interrupted.
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
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(*port), kfake.AllowAutoTopicCreation()}
	if *topics != "" {
		opts = append(opts, kfake.SeedTopics(int32(*partitions), strings.Split(*topics, ",")...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "devkafka: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("kafka listening on %s\n", c.ListenAddrs()[0])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	c.Close()
}
