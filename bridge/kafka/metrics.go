package kafka

import metrics "github.com/rcrowley/go-metrics"

// DisableMetrics switches off go-metrics, where sarama records its metrics,
// for the whole process: its meters tick in a goroutine that never stops
// and cost CPU on a small gateway, and edgegate's commands report what they
// need themselves. Call it first thing in main (or in a test's TestMain),
// before any sarama client exists: it sets a global that sarama reads
// without a lock.
func DisableMetrics() {
	metrics.UseNilMetrics = true
}
