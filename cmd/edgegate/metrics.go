package main

import (
	"bytes"
	"maps"
	"net/http"
	"slices"
	"sort"

	"github.com/edgegate/edgegate/bridge"
	"github.com/edgegate/edgegate/gateway/payload"
)

// maxDeviceMetrics bounds the per-device series: a gateway may serve
// thousands of devices, and a Prometheus series per device each would
// dominate a central server's load. The rule is simple to explain: the first
// 100 devices in order of first reading; the rest are counted.
const maxDeviceMetrics = 100

// /metrics exposes one snapshot of the gateway's and forwarder's counters
// (pipeline.status) at scrape time: nothing is counted twice, the ingest
// path pays nothing for metrics, and the figures are the ones
// /api/status, the status page and `edgegate status` show.

func desc(name, help string, labels ...string) *metricDesc {
	return &metricDesc{name: "edgegate_" + name, help: help, labels: labels}
}

var (
	mReadings     = desc("readings_total", "Readings taken from publications and sensors, by aggregation outcome (aggregated, late_revised, too_late, future, late_state_evicted, invalid, too_many_series, device_clock_unset, gateway_clock_unset).", "outcome")
	mRejected     = desc("payloads_rejected_total", "Payloads or payload items the decoder refused, by reason; each is a dead letter.", "reason")
	mPublications = desc("publications_total", "Publications on reading topics.")
	mRefused      = desc("quota_refused_total", "QoS 1/2 publications refused because the outbound queue was at its quota (backpressure).")
	mDuplicates   = desc("duplicates_total", "QoS 1/2 resends of journaled publications, acknowledged and not counted again.")
	mDupEntries   = desc("duplicate_entries", "Publications whose acknowledgement their client may not have received, kept by duplicate detection (24 bytes each), of all clients.")
	mDupEvicted   = desc("duplicate_entries_evicted_total", "Entries duplicate detection dropped at its bounds (8,192 a client, 262,144 in all), oldest first: their receipt was never learnt.")
	mUndelivered  = desc("mqtt_acks_undelivered_total", "PUBACKs owed to connections that closed before they were written; their clients resend, and duplicate detection answers.")
	mPendingWaits = desc("journal_pending_waits_total", "Publications that waited because 8 MiB were waiting for the card to take them (a slow fsync); their clients were not read meanwhile.")
	mFlowHeld     = desc("mqtt_flow_held_total", "QoS 1/2 publications whose reading waited while their client had mqtt.receive_maximum in flight (flow control, not a refusal).")
	mSummaries    = desc("summaries_total", "Summaries emitted, revisions included.")
	mOpen         = desc("open_windows", "Windows open now.")
	mSeries       = desc("series", "Series (device and metric) held in memory: those with an open window; bounded by aggregate.max_series.")
	mCached       = desc("retained_windows_cached", "Closed windows held in memory for late revisions (all are on disk).")
	mDevices      = desc("devices", "Devices seen since start or restored from the checkpoint.")
	mSessions     = desc("mqtt_persistent_sessions", "Persistent MQTT sessions kept across restarts.")
	mNotAllowed   = desc("readings_not_allowed_total", "Readings dead-lettered as device_not_allowed: they named a device other than their publisher's own (a device-role client, e.g. by SenML bn).")
	mEvicted      = desc("mqtt_sessions_evicted_total", "Persistent MQTT sessions ended early to make room for a new one (mqtt.max_sessions, mqtt.max_sessions_per_identity).")
	mClients      = desc("mqtt_clients_connected", "MQTT clients connected.")
	mBytesIn      = desc("mqtt_received_bytes_total", "MQTT bytes received.")
	mBytesOut     = desc("mqtt_sent_bytes_total", "MQTT bytes sent.")
	mQueueBytes   = desc("queue_bytes", "Bytes of the outbound queue on disk.")
	mQueued       = desc("queue_records", "Records written to the outbound queue and not yet delivered: the gateway's own consumer lag.")
	mEnqueued     = desc("queue_enqueued_total", "Records written to the outbound queue.")
	mDelivered    = desc("queue_delivered_total", "Records delivered to Kafka.")
	mDropped      = desc("queue_dropped_total", "Records dropped to respect storage.max_bytes.")
	mDeadDropped  = desc("queue_deadletters_dropped_total", "Dead letters dropped, being beyond their share of the quota (storage.deadletter_share).")
	mDeadBytes    = desc("queue_deadletter_bytes", "Bytes of undelivered dead letters in the outbound queue (queued since the start).")
	mOverQuota    = desc("queue_over_quota_total", "Summaries written beyond storage.max_bytes under the backpressure policy, rather than dropped.")
	mLost         = desc("queue_lost_total", "Records lost in damaged queue frames or undecodable.")
	mFull         = desc("queue_full", "1 while the outbound queue is over its backpressure mark.")
	mLinkUp       = desc("kafka_link_up", "1 while the link to Kafka is up.")
	mLinkState    = desc("kafka_link_state", "1 for the link's state: connecting (no answer yet since start), up (the latest batch was delivered), idle (nothing waits to be sent; the latest probe found Kafka usable), down (the latest probe, connection or send failed; see /api/status).", "state")
	mLinkStateAge = desc("kafka_link_state_seconds", "How long the link has been in its state (for down, since the spell's first failure).")
	mDrainETA     = desc("queue_drain_eta_seconds", "When the outbound queue will be empty at the last minute's delivery rate: 0 when empty, +Inf when not draining (the link is down, or nothing was delivered for a minute while records waited), NaN while waiting (records queued under a minute ago).")
	mDevPerMin    = desc("device_readings_per_minute", "Readings a minute of the device over the last minute (or since start), for the first 100 devices; absent in the first 10 s.", "device")
	mDevRevised   = desc("device_late_revisions_total", "Late readings of the device that revised a closed window, for the first 100 devices.", "device")
	mDevTooLate   = desc("device_too_late_total", "Readings of the device beyond the allowed lateness (dead-lettered as too_late), for the first 100 devices.", "device")
	mDeadLetters  = desc("deadletters_total", "Dead letters emitted for the dead-letter topic (queued, or dropped beyond their share of the queue: queue_deadletters_dropped_total), by their first reason (the decoder's, e.g. invalid_json, or the aggregator's, e.g. too_late).", "reason")
	mConnects     = desc("kafka_connects_total", "Successful connections to Kafka.")
	mSendErrors   = desc("kafka_send_errors_total", "Failed batch sends (each followed by a reconnect).")
	mPosErrors    = desc("kafka_position_errors_total", "Reads of the delivered position from the offsets topic that failed or timed out (each followed by a reconnect; never taken for \"nothing delivered\").")
	mKafkaWarns   = desc("kafka_config_warnings", "Kafka settings found at the last connection that put delivery at risk (unclean leader election, min.insync.replicas below 2, settings not checkable); listed in /api/status.")
	mJournalBytes = desc("journal_bytes", "Bytes of the ingest journal on disk.")
	mCPFailures   = desc("checkpoint_failures_total", "Checkpoints that could not be written.")
	mReplayed     = desc("journal_replayed_events", "Journal events replayed at the last start.")
	mRebuilds     = desc("state_rebuilds_total", "State files (state/state.db) found damaged or lost at start and rebuilt from what could be read, an older checkpoint and the journal; the log and /api/status say what was kept and lost.")
	mFsync        = desc("journal_fsync_seconds", "Time taken by each fsync of the ingest journal.")
	mOldest       = desc("queue_oldest_age_seconds", "How long the oldest undelivered record has been queued (to a second; records queued before the process started count from its start).")
	mRefusedRecs  = desc("kafka_refused_total", "Records set aside instead of delivered: over kafka.max_record_bytes, or refused by Kafka for good (MESSAGE_TOO_LARGE, INVALID_RECORD, ...); kept in outbound/refused.")
	mRefusedBytes = desc("kafka_refused_bytes", "Bytes of the store of records set aside (bounded by kafka.refused_max_bytes).")
	mRefusedDrop  = desc("kafka_refused_dropped_total", "Records set aside then dropped to keep their store within kafka.refused_max_bytes.")
	mBatchBytes   = desc("kafka_batch_bytes", "Bytes the next batch may take: adapted to the link, up to kafka.max_batch_bytes.")
	mBatches      = desc("kafka_batches_total", "Batches delivered to Kafka; with kafka.exactly_once each is one committed transaction (failed ones are kafka_send_errors_total).")
	mDevLastSeen  = desc("device_last_seen_age_seconds", "Time since the device's latest reading, for the first 100 devices (in order of first reading); see devices_unlisted.", "device")
	mDevWMLag     = desc("device_watermark_lag_seconds", "How far the device's event-time watermark is behind the gateway clock, for the first 100 devices.", "device")
	mDevUnlisted  = desc("devices_unlisted", "Devices beyond the first 100, left out of the per-device metrics to bound their cardinality.")
	mMQTTRefused  = desc("mqtt_refused_total", "Clients and packets the broker turned away, by reason: bad_credentials, publish_not_authorized, subscribe_not_authorized, subscription_limit, connect_rate, connect_timeout, server_busy, packet_too_large, receive_maximum, topic_alias_invalid, malformed, decoder_panic, tls_handshake, websocket_origin, client_id_not_allowed, session_limit, write_timeout, ping_rate, auth_busy, retained_limit (a retained publication taken but not retained), pending_connects, pending_connects_per_address, file_limit.", "reason")
	mRetained     = desc("mqtt_retained_messages", "Retained messages the broker keeps (bounded by mqtt.max_retained and max_retained_per_identity).")
	mRetainedB    = desc("mqtt_retained_bytes", "Bytes of the retained messages the broker keeps, topics and payloads and 1 KiB each (bounded by mqtt.max_retained_bytes and max_retained_bytes_per_identity).")
	mQueuedB      = desc("mqtt_queued_bytes", "Bytes of the QoS 1/2 messages the broker holds for subscribers, in flight or queued for away persistent sessions, topics and payloads and 1 KiB each (bounded by mqtt.max_queued_bytes and max_queued_bytes_per_session).")
	mQueuedDrop   = desc("mqtt_queued_dropped_total", "Messages dropped for a subscriber because its session (session_bytes) or all of them (total_bytes) held their bound of unacknowledged bytes.", "reason")
	mThrottled    = desc("mqtt_publish_throttled_total", "Publications held back to keep a client to mqtt.publish_rate_per_client or publish_bytes_rate_per_client (delayed, not refused).")
	mSockets      = desc("mqtt_sockets_open", "MQTT sockets open, including those that have not sent CONNECT yet.")
	mPending      = desc("mqtt_sockets_pending", "MQTT sockets that have not sent CONNECT yet (mqtt.max_pending_connects in all, mqtt.max_pending_connects_per_address from one address; more are refused at accept).")
	mMaxSockets   = desc("mqtt_sockets_max", "MQTT sockets the process's file limit leaves room for (RLIMIT_NOFILE less 256 descriptors kept for the journal, queue, state file, Kafka and HTTP); more are refused at accept (file_limit). 0: no limit known.")
	mAccepting    = desc("mqtt_listener_accepting", "1 while the MQTT listener accepts connections; 0 once its accepts have failed for over 3 s (e.g. EMFILE: out of descriptors), when /readyz fails too.", "listener")
	mAcceptErrs   = desc("mqtt_accept_errors_total", "Failed accepts of the MQTT listener, each retried after a backoff (5 ms doubling to 1 s).", "listener")
	mClockSync    = desc("clock_synchronized", "1 while the gateway's clock is synchronized (adjtimex: chrony, ntpd or systemd-timesyncd; or clock.synchronized: always).")
	mClockMaxErr  = desc("clock_max_error_seconds", "The kernel's bound on the gateway clock's error (adjtimex maxerror); 0 when unknown.")
	mClockSteps   = desc("clock_steps_total", "Steps of the gateway's wall clock (jumps of more than 1 s against the monotonic clock) since start.")
	mClockLast    = desc("clock_last_step_seconds", "Size of the latest step of the gateway's wall clock (negative: back); 0 before any.")
	mClockOffset  = desc("clock_offset_seconds", "Gateway time minus the wall clock: non-zero while the gateway keeps time by the monotonic clock after a step of an unsynchronized clock.")
	mHeld         = desc("clock_held_readings", "Readings the gateway stamped while its clock was not synchronized, held on disk until it is (bounded by clock.hold_max_bytes and clock.hold_max_age).")
	mHeldBytes    = desc("clock_held_bytes", "Bytes of the held readings in <data_dir>/hold.")
	mRebased      = desc("readings_rebased_total", "Held readings re-based to true time, by the monotonic clock, once the gateway's clock was synchronized.")
	mUnverified   = desc("readings_unverified_total", "Readings the gateway stamped while its clock was not synchronized and aggregated unchecked: it did not synchronize within clock.hold_max_age or hold_max_bytes, or the gateway booted again first.")
	mHoldRefused  = desc("hold_refused_total", "Readings refused as they were to be held (clock unsynchronized) because the aggregator's series limits would refuse them (too_many_series).")
	mHoldShare    = desc("hold_over_share_total", "Readings aggregated at once as unverified because their device held its share of clock.hold_max_bytes (an eighth).")
	mSkewed       = desc("devices_clock_skewed", "Devices whose clocks are off the gateway's synchronized clock by more than aggregate.max_device_skew for 5 minutes.")
	mDevOffset    = desc("device_clock_offset_seconds", "How far the device's clock is ahead of the gateway's synchronized clock (negative: behind), measured over 5 minutes, for the first 100 devices with a measurement.", "device")
	mDevUnset     = desc("device_clock_unset_total", "Readings the device stamped before any real reading can be (its clock never set), for the first 100 devices.", "device")
	mSensorUp     = desc("sensor_up", "1 if the sensor's last poll succeeded.", "sensor", "device")
	mSensorPolls  = desc("sensor_polls_total", "Successful polls of a sensor.", "sensor", "device")
	mSensorErrors = desc("sensor_errors_total", "Failed opens and polls of a sensor.", "sensor", "device")

	mSpNodes     = desc("sparkplug_nodes", "Sparkplug edge nodes the host keeps state for, by state (online: in a session begun by an NBIRTH; offline: after their NDEATH, or never born).", "state")
	mSpDevices   = desc("sparkplug_devices", "Devices of Sparkplug edge nodes, by state (online after their DBIRTH, offline after a DDEATH or their node's NDEATH).", "state")
	mSpMessages  = desc("sparkplug_messages_total", "Sparkplug messages applied, by type (NBIRTH, NDATA, NDEATH, DBIRTH, DDATA, DDEATH).", "type")
	mSpReadings  = desc("sparkplug_readings_total", "Readings made from Sparkplug metrics; historical ones (is_historical) also counted in sparkplug_historical_readings_total.")
	mSpHist      = desc("sparkplug_historical_readings_total", "Readings of Sparkplug metrics sent with is_historical.")
	mSpRebirths  = desc("sparkplug_rebirth_requests_total", "Rebirth requests (NCMD Node Control/Rebirth): made, or held because one was made within sparkplug.rebirth_interval.", "result")
	mSpProblems  = desc("sparkplug_problems_total", "Sparkplug problems, by kind: seq_gap, unknown_alias, before_birth, too_many_nodes, too_many_metrics, too_many_devices, identity_bound (a device identity's message for an edge node other than its own).", "kind")
	mSpForgotten = desc("sparkplug_forgotten_total", "Edge nodes and devices the host forgot, by reason: node_dead (dead for sparkplug.forget_after), node_replaced (offline, its identity birthed in another group), device_silent (offline for sparkplug.forget_after).", "reason")
	mSpDefs      = desc("sparkplug_definitions", "Metric definitions and devices the host holds (bounded by sparkplug.max_metrics).")
	mSpDeaths    = desc("sparkplug_deaths_total", "NDEATHs, by result: ended (the session the bdSeq names) or stale (an older session's, ignored).", "result")
	mSpIgnored   = desc("sparkplug_metrics_ignored_total", "Sparkplug metrics that are no reading, by why: null (is_null), type (a datatype not aggregated: String, DataSet, Template, ...; Boolean unless sparkplug.booleans), protocol (bdSeq, Node/Device Control).", "why")
)

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collect adds the families of one snapshot to e.
func collect(e *exposition, st status) {
	g, f := st.MQTT, st.Kafka
	counter, gauge := e.counter, e.gauge
	outcomes := make([]string, 0, len(g.Outcomes))
	for o := range g.Outcomes {
		outcomes = append(outcomes, o)
	}
	sort.Strings(outcomes)
	for _, o := range outcomes {
		counter(mReadings, float64(g.Outcomes[o]), o)
	}
	for _, r := range payload.AllReasons {
		counter(mRejected, float64(g.Rejected[r]), string(r))
	}
	counter(mPublications, float64(g.Publishes))
	counter(mRefused, float64(g.Refused))
	counter(mDuplicates, float64(g.Duplicates))
	gauge(mDupEntries, float64(g.DuplicateEntries))
	counter(mDupEvicted, float64(g.DuplicatesEvicted))
	counter(mUndelivered, float64(g.AcksUndelivered))
	counter(mFlowHeld, float64(g.FlowHeld))
	counter(mPendingWaits, float64(g.Journal.PendingWaits))
	for _, r := range slices.Sorted(maps.Keys(g.MQTTRefused)) {
		counter(mMQTTRefused, float64(g.MQTTRefused[r]), r)
	}
	counter(mThrottled, float64(g.Throttled))
	gauge(mRetained, float64(g.MQTTRetained))
	gauge(mRetainedB, float64(g.MQTTRetainedBytes))
	gauge(mQueuedB, float64(g.MQTTQueuedBytes))
	for _, r := range slices.Sorted(maps.Keys(g.MQTTQueuedDropped)) {
		counter(mQueuedDrop, float64(g.MQTTQueuedDropped[r]), r)
	}
	gauge(mSockets, float64(g.Sockets))
	gauge(mPending, float64(g.MQTTPending))
	gauge(mMaxSockets, float64(g.MQTTMaxSockets))
	for _, l := range g.MQTTListeners {
		gauge(mAccepting, b2f(l.Accepting), l.ID)
		counter(mAcceptErrs, float64(l.AcceptErrors), l.ID)
	}
	counter(mSummaries, float64(g.Summaries))
	gauge(mOpen, float64(g.OpenWindows))
	gauge(mSeries, float64(g.Series))
	gauge(mCached, float64(g.Retained))
	gauge(mDevices, float64(g.Devices))
	gauge(mSessions, float64(g.Sessions))
	counter(mEvicted, float64(g.SessionsEvicted))
	counter(mNotAllowed, float64(g.NotAllowed))
	gauge(mClients, float64(g.Clients))
	counter(mBytesIn, float64(g.BytesIn))
	counter(mBytesOut, float64(g.BytesOut))
	gauge(mQueueBytes, float64(f.QueueBytes))
	gauge(mQueued, float64(f.Queued))
	counter(mEnqueued, float64(f.Enqueued))
	counter(mDelivered, float64(f.Delivered))
	counter(mDropped, float64(f.Dropped))
	counter(mDeadDropped, float64(f.DeadLettersDropped))
	gauge(mDeadBytes, float64(f.DeadLetterBytes))
	counter(mOverQuota, float64(f.OverQuota))
	counter(mLost, float64(f.Lost))
	gauge(mFull, b2f(f.Full))
	gauge(mLinkUp, b2f(f.LinkUp))
	for _, state := range []bridge.LinkState{bridge.LinkConnecting, bridge.LinkUp, bridge.LinkIdle, bridge.LinkDown} {
		gauge(mLinkState, b2f(f.Link == state), string(state))
	}
	gauge(mLinkStateAge, st.Now.Sub(f.LinkSince).Seconds())
	gauge(mDrainETA, st.Figures.Drain.etaMetric())
	for _, r := range slices.Sorted(maps.Keys(g.DeadLetters)) {
		counter(mDeadLetters, float64(g.DeadLetters[r]), r)
	}
	counter(mConnects, float64(f.Connects))
	counter(mSendErrors, float64(f.SendErrors))
	counter(mPosErrors, float64(f.PositionErrors))
	gauge(mKafkaWarns, float64(len(f.KafkaWarnings)))
	gauge(mJournalBytes, float64(g.Journal.Bytes))
	counter(mCPFailures, float64(g.Journal.CheckpointFailures))
	gauge(mReplayed, float64(g.Journal.Replayed))
	counter(mRebuilds, float64(g.Journal.StateRebuilds))
	h := g.Journal.FsyncLatency
	e.histogram(mFsync, h.Count, h.Sum, h.Bounds, h.Counts)
	gauge(mOldest, f.OldestAge.Seconds())
	counter(mBatches, float64(f.Batches))
	gauge(mBatchBytes, float64(f.BatchBytes))
	counter(mRefusedRecs, float64(f.Refused))
	gauge(mRefusedBytes, float64(f.RefusedBytes))
	counter(mRefusedDrop, float64(f.RefusedDropped))
	now := st.Now
	listed := 0
	for _, d := range g.DeviceList {
		if listed == maxDeviceMetrics {
			break
		}
		listed++
		gauge(mDevLastSeen, now.Sub(d.LastSeen).Seconds(), d.ID)
		lag := 0.0
		if !d.Watermark.IsZero() {
			lag = now.Sub(d.Watermark).Seconds()
		}
		gauge(mDevWMLag, lag, d.ID)
		if d.ClockMeasured {
			gauge(mDevOffset, d.ClockOffset.Seconds(), d.ID)
		}
		counter(mDevUnset, float64(d.ClockUnset), d.ID)
		counter(mDevRevised, float64(d.Revised), d.ID)
		counter(mDevTooLate, float64(d.TooLate), d.ID)
		if df, ok := st.Figures.Devices[d.ID]; ok && df.ReadingsPerMin != nil {
			gauge(mDevPerMin, *df.ReadingsPerMin, d.ID)
		}
	}
	gauge(mDevUnlisted, float64(g.Devices-listed))
	clk := g.Clock
	gauge(mClockSync, b2f(clk.Synchronized))
	gauge(mClockMaxErr, clk.MaxError.Seconds())
	counter(mClockSteps, float64(clk.Steps))
	gauge(mClockLast, clk.LastStep.Seconds())
	gauge(mClockOffset, clk.Offset.Seconds())
	gauge(mSkewed, float64(g.SkewedDevices))
	gauge(mHeld, float64(g.Hold.Readings))
	gauge(mHeldBytes, float64(g.Hold.Bytes))
	counter(mRebased, float64(g.Hold.Rebased))
	counter(mUnverified, float64(g.Hold.Unverified))
	counter(mHoldRefused, float64(g.Hold.Refused))
	counter(mHoldShare, float64(g.Hold.OverShare))
	for _, s := range g.Sensors {
		gauge(mSensorUp, b2f(s.Up), s.Sensor, s.Device)
		counter(mSensorPolls, float64(s.Polls), s.Sensor, s.Device)
		counter(mSensorErrors, float64(s.Errors), s.Sensor, s.Device)
	}
	if sp := g.Sparkplug; sp != nil {
		gauge(mSpNodes, float64(sp.NodesOnline), "online")
		gauge(mSpNodes, float64(sp.Nodes-sp.NodesOnline), "offline")
		gauge(mSpDevices, float64(sp.DevicesOnline), "online")
		gauge(mSpDevices, float64(sp.Devices-sp.DevicesOnline), "offline")
		for _, t := range slices.Sorted(maps.Keys(sp.Messages)) {
			counter(mSpMessages, float64(sp.Messages[t]), t)
		}
		counter(mSpReadings, float64(sp.Readings))
		counter(mSpHist, float64(sp.Historical))
		counter(mSpRebirths, float64(sp.RebirthRequests), "made")
		counter(mSpRebirths, float64(sp.RebirthsHeld), "held")
		counter(mSpProblems, float64(sp.SeqGaps), "seq_gap")
		counter(mSpProblems, float64(sp.UnknownAliases), "unknown_alias")
		counter(mSpProblems, float64(sp.BeforeBirth), "before_birth")
		counter(mSpProblems, float64(sp.TooManyNodes), "too_many_nodes")
		counter(mSpProblems, float64(sp.TooManyMetrics), "too_many_metrics")
		counter(mSpProblems, float64(sp.TooManyDevices), "too_many_devices")
		counter(mSpProblems, float64(sp.IdentityBound), "identity_bound")
		for _, r := range slices.Sorted(maps.Keys(sp.Forgotten)) {
			counter(mSpForgotten, float64(sp.Forgotten[r]), r)
		}
		gauge(mSpDefs, float64(sp.Definitions))
		counter(mSpDeaths, float64(sp.SessionsEnded), "ended")
		counter(mSpDeaths, float64(sp.StaleDeaths), "stale")
		counter(mSpIgnored, float64(sp.Nulls), "null")
		counter(mSpIgnored, float64(sp.NotAggregated), "type")
		counter(mSpIgnored, float64(sp.Protocol), "protocol")
	}
}

// metricsHandler serves /metrics in the Prometheus text format: the
// gateway's metrics, and the Go runtime's and the process's (memory, CPU,
// file descriptors).
func (p *pipeline) metricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := newExposition()
		collect(e, p.status())
		collectGo(e)
		collectProcess(e)
		var buf bytes.Buffer
		e.write(&buf) // a bytes.Buffer does not fail
		w.Header().Set("Content-Type", expositionType)
		w.Write(buf.Bytes())
	})
}
