// Package configs loads and validates the edgegate configuration file (one
// YAML document; see edgegate.yaml beside this file for every key, commented).
//
// Loading is strict: unknown keys are errors and every value is checked.
// One run reports every problem (Problems), each naming its key and line,
// what is wrong and how to fix it.
package configs

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/edgegate/edgegate/aggregate"
	"github.com/edgegate/edgegate/devices"
	"github.com/edgegate/edgegate/gateway/payload"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// Config is the whole configuration file.
type Config struct {
	Gateway   Gateway   `yaml:"gateway"`
	MQTT      MQTT      `yaml:"mqtt"`
	Aggregate Aggregate `yaml:"aggregate"`
	Clock     Clock     `yaml:"clock"`
	Kafka     Kafka     `yaml:"kafka"`
	Storage   Storage   `yaml:"storage"`
	HTTP      HTTP      `yaml:"http"`
	Log       Log       `yaml:"log"`
	Sensors   []Sensor  `yaml:"sensors"`
	Sparkplug Sparkplug `yaml:"sparkplug"`
}

// Sparkplug makes the gateway a Sparkplug B host application (Eclipse
// Sparkplug 3.0): edge nodes' BIRTH, DATA and DEATH messages on
// spBv1.0/<group>/... become readings of device
// <group><sep><edge_node>[<sep><device>], metric the metric's name.
type Sparkplug struct {
	Enabled bool `yaml:"enabled"`
	// HostID names the host in spBv1.0/STATE/<host_id>, which edge nodes
	// configured with a primary host wait for; empty: gateway.id.
	HostID string `yaml:"host_id"`
	// Groups, if set, are the only group ids ingested.
	Groups []string `yaml:"groups"`
	// RebirthInterval is the least time between two rebirth requests
	// (NCMD Node Control/Rebirth) to one edge node.
	RebirthInterval Duration `yaml:"rebirth_interval"`
	// DeviceSeparator joins group, edge node and device in device names.
	DeviceSeparator string `yaml:"device_separator"`
	// Booleans aggregates Boolean metrics as 0 and 1; off, they are
	// counted and not aggregated.
	Booleans bool `yaml:"booleans"`
	// MaxNodes bounds the edge nodes the host keeps state for;
	// MaxMetricsPerNode the metric definitions (and devices) of one;
	// MaxDevicesPerNode the devices of one; MaxMetrics the metric
	// definitions and devices of all. A device-role identity is one edge
	// node (its first NBIRTH's group), so these bound what one identity
	// can make the host hold.
	MaxNodes          int `yaml:"max_nodes"`
	MaxMetricsPerNode int `yaml:"max_metrics_per_node"`
	MaxDevicesPerNode int `yaml:"max_devices_per_node"`
	MaxMetrics        int `yaml:"max_metrics"`
	// ForgetAfter is how long an edge node stays known after its death,
	// and a device after it went offline, while nothing is heard of it.
	ForgetAfter Duration `yaml:"forget_after"`
}

// Sensor is an I²C sensor the gateway polls itself. Its readings enter the
// pipeline as if device Device had published them (and are published on
// the local broker too).
type Sensor struct {
	// Bus is the periph name of the I²C bus ("/dev/i2c-1", "I2C1", "1"),
	// or "emulated" for chips simulated in the gateway (any machine).
	Bus     string   `yaml:"bus"`
	Address int      `yaml:"address"` // 7-bit, e.g. 0x76
	Driver  string   `yaml:"driver"`  // a devices.Drivers name: bme280 (also BMP280), sht3x, bh1750
	Every   Duration `yaml:"interval"`
	Device  string   `yaml:"device"`
	// Metrics renames the driver's metrics (temperature, pressure,
	// humidity, illuminance) in the readings.
	Metrics map[string]string `yaml:"metrics"`
}

// driverNames lists the drivers for an error message: "bme280 (also for
// BMP280), sht3x or bh1750".
func driverNames() string {
	var names []string
	for _, d := range devices.Drivers() {
		n := d.Name
		if len(d.Chips) > 1 {
			n += " (also for " + strings.Join(d.Chips[1:], ", ") + ")"
		}
		names = append(names, n)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// driverAddresses lists each chip's addresses for an error message:
// "BME280 0x76/0x77, SHT3x 0x44/0x45, BH1750 0x23/0x5c".
func driverAddresses() string {
	var chips []string
	for _, d := range devices.Drivers() {
		var addrs []string
		for _, a := range d.Addresses {
			addrs = append(addrs, fmt.Sprintf("%#x", a))
		}
		chips = append(chips, d.Chips[0]+" "+strings.Join(addrs, "/"))
	}
	return strings.Join(chips, ", ")
}

// SensorTopic returns the MQTT topic a sensor's readings for metric are
// published on: the first mqtt.topics pattern with {device} and {metric}.
func (c *Config) SensorTopic(device, metric string) (string, bool) {
	for _, t := range c.MQTT.Topics {
		if strings.Contains(t, "{device}") && strings.Contains(t, "{metric}") {
			return strings.NewReplacer("{device}", device, "{metric}", metric).Replace(t), true
		}
	}
	return "", false
}

// Gateway identifies the gateway.
type Gateway struct {
	// ID names the gateway in every summary and record key; the Kafka
	// transactional id derives from it. Empty: the gateway makes one at
	// its first start and keeps it in the data directory (see
	// ResolveGatewayID).
	ID      string `yaml:"id"`
	DataDir string `yaml:"data_dir"`
}

// MQTT configures the embedded broker and how topics map to readings.
type MQTT struct {
	Listen         string   `yaml:"listen"`
	AllowAnonymous bool     `yaml:"allow_anonymous"`
	UsersFile      string   `yaml:"users_file"`
	Topics         []string `yaml:"topics"`
	MaxPayload     int      `yaml:"max_payload_bytes"`
	MaxPacket      int      `yaml:"max_packet_bytes"`
	// Per-client resources: these dominate the broker's memory with
	// thousands of devices.
	ClientWriteQueue  int `yaml:"client_write_queue"`
	ClientReadBuffer  int `yaml:"client_read_buffer_bytes"`
	ClientWriteBuffer int `yaml:"client_write_buffer_bytes"`
	ReceiveMaximum    int `yaml:"receive_maximum"`

	TLS       TLSListener `yaml:"tls"`
	WebSocket WebSocket   `yaml:"websocket"`
	ACL       ACL         `yaml:"acl"`

	// Limits. Each refusal is counted in edgegate_mqtt_refused_total.
	TopicAliasMaximum int      `yaml:"topic_alias_maximum"`
	MaxSessionExpiry  Duration `yaml:"max_session_expiry"`
	// MaxSessions caps the persistent sessions kept (connected or not),
	// MaxSessionsPerIdentity those of one identity; DeviceClientIDs says
	// which client ids a device may use (prefixed, identity or any).
	MaxSessions            int      `yaml:"max_sessions"`
	MaxSessionsPerIdentity int      `yaml:"max_sessions_per_identity"`
	DeviceClientIDs        string   `yaml:"device_client_ids"`
	MaxClients             int      `yaml:"max_clients"`
	MaxSubscriptions       int      `yaml:"max_subscriptions_per_client"`
	ConnectTimeout         Duration `yaml:"connect_timeout"`
	ConnectRate            float64  `yaml:"connect_rate_per_address"`
	ConnectBurst           int      `yaml:"connect_burst_per_address"`
	ConnectRateExempt      []string `yaml:"connect_rate_exempt"`
	PublishRate            float64  `yaml:"publish_rate_per_client"`
	PingRate               float64  `yaml:"ping_rate_per_client"`
	MaxKeepAlive           Duration `yaml:"max_keep_alive"`
	WriteTimeout           Duration `yaml:"write_timeout"`
	// ReceiptMargin is how long a connection must outlive the client's TCP
	// acknowledgement of a PUBACK for the PUBACK to count as received
	// (duplicate detection then forgets the publication).
	ReceiptMargin Duration `yaml:"receipt_margin"`
	// MaxPasswordChecks bounds the bcrypt comparisons running at once;
	// 0 is half the cores (GOMAXPROCS), at least 1.
	MaxPasswordChecks int `yaml:"max_password_checks"`
	// MaxPendingConnects bounds the sockets that have not sent CONNECT
	// yet, MaxPendingConnectsPerAddress those from one address (IPv6:
	// one /64); more are closed at accept (pending_connects,
	// pending_connects_per_address).
	MaxPendingConnects           int `yaml:"max_pending_connects"`
	MaxPendingConnectsPerAddress int `yaml:"max_pending_connects_per_address"`
	// PublishBytesRate bounds the bytes a client publishes per second
	// (topic and payload), with bursts of PublishBytesBurst: the
	// message rate alone lets a client send max_packet_bytes a message.
	PublishBytesRate  ByteSize `yaml:"publish_bytes_rate_per_client"`
	PublishBytesBurst ByteSize `yaml:"publish_bytes_burst_per_client"`

	// MaxRetained and MaxRetainedBytes bound the retained messages the
	// broker keeps, MaxRetainedPerIdentity and MaxRetainedBytesPerIdentity
	// those one identity published; beyond them the retain flag is not
	// honoured (retained_limit).
	MaxRetained                 int      `yaml:"max_retained"`
	MaxRetainedBytes            ByteSize `yaml:"max_retained_bytes"`
	MaxRetainedPerIdentity      int      `yaml:"max_retained_per_identity"`
	MaxRetainedBytesPerIdentity ByteSize `yaml:"max_retained_bytes_per_identity"`
	// MaxQueuedBytesPerSession and MaxQueuedBytes bound the QoS 1/2
	// messages held for subscribers (in flight, or queued for an away
	// persistent session), per session and in all; beyond them messages
	// are dropped for that session.
	MaxQueuedBytesPerSession ByteSize `yaml:"max_queued_bytes_per_session"`
	MaxQueuedBytes           ByteSize `yaml:"max_queued_bytes"`
}

// TLSListener is the broker's MQTT over TLS listener.
type TLSListener struct {
	// Listen is host:port; empty disables the listener.
	Listen   string `yaml:"listen"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, if set, verifies client certificates against these CAs;
	// a verified certificate's common name (or first DNS SAN) is the
	// client's identity.
	ClientCAFile      string `yaml:"client_ca_file"`
	RequireClientCert bool   `yaml:"require_client_cert"`
}

// WebSocket is the broker's optional MQTT over WebSocket listener.
type WebSocket struct {
	Listen string `yaml:"listen"`
	// TLS serves wss:// with mqtt.tls's certificate.
	TLS bool `yaml:"tls"`
	// AllowedOrigins lists the web origins ("https://dash.example.com")
	// whose pages may connect. A browser sends its page's origin with
	// every WebSocket handshake and lets any page on the LAN connect to
	// any address it can reach; a handshake with an origin not listed is
	// refused (HTTP 403). Clients that are not browsers send none and are
	// let in. "*" allows every origin.
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// ACL says which topics each client may publish to and subscribe to.
type ACL struct {
	// Users gives a username (of mqtt.users_file) a role; every other user
	// is a device.
	Users map[string]string `yaml:"users"`
	// Certificates gives a client certificate's name (its common name, or
	// first DNS name) a role; every other certificate is a device. The two
	// namespaces are separate: a certificate named like an admin user is
	// not an admin (the CA that signs devices' certificates need not be
	// trusted with roles).
	Certificates map[string]string `yaml:"certificates"`
	// AnonymousRole is the role of clients let in by allow_anonymous. Their
	// identity is their client id. The default, device, keeps each to the
	// readings of the device its client id names.
	AnonymousRole string `yaml:"anonymous_role"`
	// Roles adds roles or replaces the built-in device, subscriber and
	// admin roles.
	Roles map[string]Role `yaml:"roles"`
}

// Role is a set of topic filters, in which {username} stands for the
// client's identity and {clientid} for its client id, each filling whole
// topic levels. A deny filter wins over the allowing ones: a role may
// subscribe to "#" and be kept off "secret/#", whose messages it is then
// never sent.
type Role struct {
	Publish       []string `yaml:"publish"`
	Subscribe     []string `yaml:"subscribe"`
	DenyPublish   []string `yaml:"deny_publish"`
	DenySubscribe []string `yaml:"deny_subscribe"`
}

// Aggregate sets the windowing rules.
type Aggregate struct {
	Window          Duration `yaml:"window"`
	MaxOutOfOrder   Duration `yaml:"max_out_of_order"`
	IdleClose       Duration `yaml:"idle_close"`
	AllowedLateness Duration `yaml:"allowed_lateness"`
	MaxFutureSkew   Duration `yaml:"max_future_skew"`
	// UntrustedDeviceTime is what becomes of a reading its device stamped
	// before any real reading can be (a clock that was never set, counting
	// from 1970): "arrival" stamps it on arrival while the gateway's clock
	// is synchronized and dead-letters it (device_clock_unset) while not;
	// "deadletter" always dead-letters it.
	UntrustedDeviceTime string `yaml:"untrusted_device_time"`
	// MaxDeviceSkew: a device whose clock is off the gateway's
	// synchronized clock by more than this for 5 minutes is reported
	// (status page, edgegate_device_clock_skewed); 0 reports none.
	MaxDeviceSkew Duration `yaml:"max_device_skew"`
	MaxRetained   int      `yaml:"max_retained_windows"`
	// MaxDevices, MaxSeries and MaxMetricsPerDevice bound the series (one
	// per device and metric) the aggregator holds in RAM, so that no
	// device, publishing any metric names it likes, can exhaust memory (and
	// a replay of the journal after the crash repeat it). A reading that
	// would make a series beyond them is dead-lettered as too_many_series.
	// A series whose windows have closed is not counted.
	MaxDevices          int `yaml:"max_devices"`
	MaxSeries           int `yaml:"max_series"`
	MaxMetricsPerDevice int `yaml:"max_metrics_per_device"`
}

// Kafka configures the uplink.
type Kafka struct {
	Brokers         []string `yaml:"brokers"`
	SummariesTopic  string   `yaml:"summaries_topic"`
	DeadletterTopic string   `yaml:"deadletter_topic"`
	ClientID        string   `yaml:"client_id"`
	// ExactlyOnce writes each batch in a Kafka transaction together with the
	// gateway's delivered position (in OffsetsTopic), with transactional id
	// "edgegate-<gateway.id>". Off: idempotent, at-least-once delivery.
	ExactlyOnce  bool   `yaml:"exactly_once"`
	OffsetsTopic string `yaml:"offsets_topic"`
	// MaxRecordBytes bounds one record sent to Kafka (key, value, headers
	// and the record's overhead); it must stay below the brokers' (and the
	// topics') message.max.bytes. A larger record, or one Kafka refuses
	// for good, is set aside under <data_dir>/outbound/refused and
	// delivery goes on.
	MaxRecordBytes ByteSize `yaml:"max_record_bytes"`
	// RefusedMaxBytes bounds the records set aside; beyond it the oldest
	// of them are dropped (counted).
	RefusedMaxBytes ByteSize `yaml:"refused_max_bytes"`
	// MaxBatchBytes caps one batch (one transaction); within it batches
	// adapt to the link, starting at 16KiB.
	MaxBatchBytes ByteSize `yaml:"max_batch_bytes"`
	// StallTimeout: a batch or commit during which no byte moves to or
	// from Kafka for this long is abandoned and the producer replaced.
	StallTimeout Duration  `yaml:"stall_timeout"`
	TLS          KafkaTLS  `yaml:"tls"`
	SASL         KafkaSASL `yaml:"sasl"`
}

// KafkaTLS configures TLS to the brokers.
type KafkaTLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile verifies the brokers; empty uses the system's CAs.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the gateway's client certificate (mutual
	// TLS), if the brokers want one.
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// KafkaSASL configures SASL authentication to the brokers. The password
// comes from a file or an environment variable, never from this file.
type KafkaSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty disables
	// SASL.
	Mechanism    string `yaml:"mechanism"`
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
}

// Password reads the SASL password from its file (trailing newline
// removed) or environment variable.
func (s KafkaSASL) Password() (string, error) {
	switch {
	case s.PasswordFile != "":
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("kafka.sasl.password_file: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	case s.PasswordEnv != "":
		v, ok := os.LookupEnv(s.PasswordEnv)
		if !ok {
			return "", fmt.Errorf("kafka.sasl.password_env: environment variable %s is not set", s.PasswordEnv)
		}
		return v, nil
	}
	return "", errors.New("kafka.sasl: set password_file or password_env")
}

// Storage bounds what the gateway keeps on disk.
type Storage struct {
	// MaxBytes is the quota of the outbound queue (summaries and dead
	// letters not yet delivered to Kafka).
	MaxBytes ByteSize `yaml:"max_bytes"`
	// FullPolicy is what happens at the quota: "backpressure" (stop
	// acknowledging QoS 1/2 readings so devices keep them) or "drop_oldest"
	// (drop the oldest undelivered summaries). Either way it is counted.
	FullPolicy string `yaml:"full_policy"`
	// DeadLetterPayload bounds the payload copied into a dead letter (its
	// length and SHA-256 are always there): one publication makes at most
	// one dead letter, and a 64 KiB payload costs the queue about this much
	// rather than all of it.
	DeadLetterPayload ByteSize `yaml:"deadletter_payload_bytes"`
	// DeadLetterShare is the part of max_bytes dead letters may use (0.1
	// is 10%); beyond it they are counted and dropped, so that a hostile
	// device's refused payloads never fill the queue nor displace a
	// summary.
	DeadLetterShare float64 `yaml:"deadletter_share"`
	// CheckpointInterval is how often the gateway's state (open and
	// retained windows, sessions) is written to <data_dir>/state, so that
	// a restart replays at most this much of the ingest journal.
	CheckpointInterval Duration `yaml:"checkpoint_interval"`
	// FsyncInterval is the shortest time between two fsyncs of the ingest
	// journal: readings arriving meanwhile share the next one. It bounds
	// the writes to the card (each fsync costs at least a block and a
	// filesystem journal commit) at the price of up to this much PUBACK
	// latency.
	FsyncInterval Duration `yaml:"fsync_interval"`
}

// ByteSize is a size in bytes, written as a number or with a unit: 512MiB,
// 1GiB, 64KB.
type ByteSize int64

var byteUnits = map[string]int64{
	"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	bad := badValue(n, "is not a size; write bytes or a number with a unit, e.g. 512MiB or 2GiB")
	if n.Kind != yaml.ScalarNode {
		return bad
	}
	v := strings.TrimSpace(n.Value)
	i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := v, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(v[:i]), strings.ToLower(strings.TrimSpace(v[i:]))
	}
	f, err := strconv.ParseFloat(num, 64)
	mult, ok := byteUnits[unit]
	if err != nil || !ok || f < 0 || f*float64(mult) > 1<<62 {
		return bad
	}
	*b = ByteSize(f * float64(mult))
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (b ByteSize) MarshalYAML() (any, error) {
	for _, u := range []struct {
		name string
		n    int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if int64(b) >= u.n && int64(b)%u.n == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.n, u.name), nil
		}
	}
	return int64(b), nil
}

// HTTP configures the operations endpoint.
type HTTP struct {
	Listen string `yaml:"listen"`
	// Pprof serves Go's profiler under /debug/pprof/, for diagnosing memory
	// and CPU use in the field. Off by default.
	Pprof bool `yaml:"pprof"`
}

// Clock says how the gateway knows that its own clock can be believed.
type Clock struct {
	// Synchronized: "auto" asks the kernel (adjtimex), whose status
	// chrony, ntpd and systemd-timesyncd keep; "always" takes the clock as
	// right whatever the kernel says, for a clock set by means it does not
	// know of (a battery-backed real-time clock, GPS without kernel
	// discipline, a lab machine without NTP).
	Synchronized string `yaml:"synchronized"`
	// HoldMaxBytes and HoldMaxAge bound the hold of readings the gateway
	// stamps itself (no time in the payload, its own sensors) while its
	// clock is not synchronized: they wait, on disk, to be re-based to
	// true time once it is; beyond either bound they are aggregated at
	// the unsynchronized time, marked unverified. 0 bytes holds none.
	HoldMaxBytes ByteSize `yaml:"hold_max_bytes"`
	HoldMaxAge   Duration `yaml:"hold_max_age"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Duration is a time.Duration written in Go syntax (90s, 1m, 24h).
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return badValue(n, "is not a duration; write it as 1m, 90s or 1h30m")
	}
	*d = Duration(v)
	return nil
}

// badValue is an unmarshaler's error: a TypeError, on which yaml goes on to
// the next key, in yaml's words ("line 7: ...").
func badValue(n *yaml.Node, why string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s %s", n.Line, describe(n), why)}}
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Default returns the configuration used for every key the file leaves out.
// Kafka brokers have no default.
func Default() Config {
	ac := aggregate.DefaultConfig()
	return Config{
		Gateway: Gateway{DataDir: "/var/lib/edgegate"}, // ID: see ResolveGatewayID
		MQTT: MQTT{
			Listen:            "0.0.0.0:1883",
			Topics:            []string{"sensors/{device}/{metric}", "sensors/{device}"},
			MaxPayload:        payload.DefaultMaxPayload,
			MaxPacket:         256 << 10,
			ClientWriteQueue:  32,
			ClientReadBuffer:  1024,
			ClientWriteBuffer: 512,
			ReceiveMaximum:    256,
			ACL:               ACL{AnonymousRole: "device"},
			TopicAliasMaximum: 16,
			MaxSessionExpiry:  Duration(7 * 24 * time.Hour),
			// A persistent session per client mqtt.max_clients lets in;
			// a device needs one, a second for an updater at most.
			MaxSessions:            10000,
			MaxSessionsPerIdentity: 4,
			DeviceClientIDs:        "prefixed",
			MaxClients:             10000,
			MaxSubscriptions:       32,
			ConnectTimeout:         Duration(10 * time.Second),
			ConnectRate:            5,
			ConnectBurst:           20,
			ConnectRateExempt:      []string{"127.0.0.0/8", "::1/128"},
			PublishRate:            1000,
			// A device sends CONNECT within a second or two of its
			// socket (TLS included), so a thousand devices reconnecting
			// together (a site's power back) stay under it; 1,024 silent
			// sockets cost 1,024 descriptors (of the 524,288 systemd
			// allows by default, to which Go raises its soft limit) and
			// some 10 MB. The file limit lowers it to half of what it
			// leaves MQTT (see broker.newSocketBudget).
			MaxPendingConnects: 1024,
			// A site behind one NAT address connects its devices in
			// bursts of connect_burst_per_address (20): room for those
			// and a few slow ones, and one address cannot take more
			// than 1/32 of max_pending_connects.
			MaxPendingConnectsPerAddress: 32,
			// A Pi's SD card writes 10 MB/s or so (an A1 or class 10
			// card's minimum sequential write), and the journal writes
			// every byte published, so one client may take a tenth of
			// it: 1 MiB/s, with bursts of four max_packet_bytes
			// publications. A sensor's readings are a few hundred bytes:
			// even at publish_rate_per_client (1000/s) it stays under.
			PublishBytesRate:  1 << 20,
			PublishBytesBurst: 1 << 20,
			// A client pings at most once per keep alive (1 s at the
			// least); PINGREQs faster than this are a flood.
			PingRate: 1,
			// A vanished MQTT 5 client holds its socket, its session's
			// connected state and its will (a Sparkplug NDEATH) for 1.5
			// times its keep alive: 3 min here. Common clients ask for
			// 60 s (paho, MQTT.js) and are told nothing; one asking for
			// more, or for none, is told 2 min, at the cost of a 2-byte
			// PINGREQ every 2 min. Raise it for battery devices on
			// costly links.
			MaxKeepAlive:  Duration(2 * time.Minute),
			WriteTimeout:  Duration(10 * time.Second),
			ReceiptMargin: Duration(time.Second),

			// What the broker holds for clients: about 100 MiB at the
			// most, which a Pi can spare (see edgegate.yaml).
			MaxRetained:                 10000,
			MaxRetainedBytes:            32 << 20,
			MaxRetainedPerIdentity:      256,
			MaxRetainedBytesPerIdentity: 1 << 20,
			MaxQueuedBytesPerSession:    4 << 20,
			MaxQueuedBytes:              64 << 20,
		},
		Aggregate: Aggregate{
			Window:          Duration(ac.Window),
			MaxOutOfOrder:   Duration(ac.MaxOutOfOrder),
			IdleClose:       Duration(ac.IdleClose),
			AllowedLateness: Duration(ac.AllowedLateness),
			MaxFutureSkew:   Duration(ac.MaxFutureSkew),
			MaxRetained:     ac.MaxRetained,

			UntrustedDeviceTime: "arrival",
			MaxDeviceSkew:       Duration(ac.MaxDeviceSkew),

			MaxDevices:          ac.MaxDevices,
			MaxSeries:           ac.MaxSeries,
			MaxMetricsPerDevice: ac.MaxMetricsPerDevice,
		},
		Clock: Clock{Synchronized: "auto", HoldMaxBytes: 64 << 20, HoldMaxAge: Duration(time.Hour)},
		Kafka: Kafka{
			SummariesTopic:  "edge.summaries",
			DeadletterTopic: "edge.deadletter",
			ClientID:        "edgegate",
			ExactlyOnce:     true,
			OffsetsTopic:    "edge.offsets",
			MaxRecordBytes:  512 << 10,
			RefusedMaxBytes: 16 << 20,
			MaxBatchBytes:   1 << 20,
			StallTimeout:    Duration(10 * time.Second),
		},
		Storage: Storage{MaxBytes: 1 << 30, FullPolicy: "backpressure", DeadLetterPayload: 4 << 10, DeadLetterShare: 0.1, CheckpointInterval: Duration(10 * time.Second), FsyncInterval: Duration(5 * time.Millisecond)},
		HTTP:    HTTP{Listen: "127.0.0.1:9100"},
		Log:     Log{Level: "info", Format: "text"},
		Sparkplug: Sparkplug{RebirthInterval: Duration(sparkplug.DefaultRebirthInterval), DeviceSeparator: sparkplug.DefaultSeparator,
			MaxNodes: sparkplug.DefaultMaxNodes, MaxMetricsPerNode: sparkplug.DefaultMaxMetricsPerNode,
			MaxDevicesPerNode: sparkplug.DefaultMaxDevicesPerNode, MaxMetrics: sparkplug.DefaultMaxMetrics,
			ForgetAfter: Duration(sparkplug.DefaultForgetAfter)},
	}
}

// TransactionalID returns the Kafka transactional id of this gateway.
func (c *Config) TransactionalID() string { return "edgegate-" + c.Gateway.ID }

// AggregateConfig returns the aggregator's configuration.
func (c *Config) AggregateConfig() aggregate.Config {
	return aggregate.Config{
		Gateway:         c.Gateway.ID,
		Window:          c.Aggregate.Window.D(),
		MaxOutOfOrder:   c.Aggregate.MaxOutOfOrder.D(),
		IdleClose:       c.Aggregate.IdleClose.D(),
		AllowedLateness: c.Aggregate.AllowedLateness.D(),
		MaxFutureSkew:   c.Aggregate.MaxFutureSkew.D(),
		MaxRetained:     c.Aggregate.MaxRetained,

		TimeFloor:           aggregate.DefaultTimeFloor(),
		UntrustedDeviceTime: untrustedPolicies[c.Aggregate.UntrustedDeviceTime],
		MaxDeviceSkew:       c.Aggregate.MaxDeviceSkew.D(),
		DeviceSkewPeriod:    aggregate.DefaultConfig().DeviceSkewPeriod,

		MaxDevices:          c.Aggregate.MaxDevices,
		MaxSeries:           c.Aggregate.MaxSeries,
		MaxMetricsPerDevice: c.Aggregate.MaxMetricsPerDevice,
	}
}

// untrustedPolicies maps aggregate.untrusted_device_time's values.
var untrustedPolicies = map[string]aggregate.UntrustedPolicy{"arrival": aggregate.UntrustedArrival, "deadletter": aggregate.UntrustedDeadLetter}

// Load reads, decodes and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a configuration document. Its error, but for
// a document that is not YAML at all, is Problems: every problem found, each
// with its key, line and fix. A bad value keeps its default so that the
// rest is still decoded and validated, and Validate's rules about it (or
// about a key a misspelt one was meant to be) are left out, as they would
// only repeat the problem.
func Parse(data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if len(root.Content) == 0 {
		return nil, errors.New("file is empty; at least kafka.brokers must be set")
	}
	c := Default()
	d := decoder{lines: map[string]int{}}
	d.decode(root.Content[0], reflect.ValueOf(&c).Elem(), "", 0)
	problems := d.problems
	for _, p := range c.problems() {
		if !d.consequential(p.Key) {
			line, set := d.lines[p.Key]
			p.Line, p.Unset = line, !set
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return nil, problems.sorted()
	}
	return &c, nil
}

var (
	idRE    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	topicRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
)

func sanitizeID(s string) string {
	s = regexp.MustCompile(`[^A-Za-z0-9._-]`).ReplaceAllString(s, "-")
	if len(s) > 64 {
		s = s[:64]
	}
	if s == "" {
		s = "edgegate"
	}
	return s
}

// Validate checks every value and cross-key rule. Its error is Problems,
// each naming an offending key and what would fix it.
func (c *Config) Validate() error {
	if p := c.problems(); len(p) > 0 {
		return p
	}
	return nil
}

// problems is Validate's list, sorted by key; a Config has no lines.
func (c *Config) problems() Problems {
	var p Problems
	add := func(key, format string, args ...any) {
		p = append(p, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Gateway.ID != "" && !idRE.MatchString(c.Gateway.ID) {
		add("gateway.id", "%q is not a valid id; use 1-64 letters, digits, '.', '_' or '-' (it names the gateway in every summary and its Kafka transactional id), or leave it unset for one the gateway makes", c.Gateway.ID)
	}
	if c.Gateway.DataDir == "" {
		add("gateway.data_dir", "is empty; set a directory the gateway may write, e.g. /var/lib/edgegate")
	}
	if c.MQTT.Listen != "" {
		checkAddr(add, "mqtt.listen", c.MQTT.Listen, false)
	}
	if len(c.MQTT.Topics) == 0 {
		add("mqtt.topics", `is empty; list at least one pattern, e.g. ["sensors/{device}/{metric}"]`)
	}
	seen := map[string]bool{}
	for i, t := range c.MQTT.Topics {
		if _, err := payload.CompilePattern(t); err != nil {
			add(fmt.Sprintf("mqtt.topics[%d]", i), "%v", err)
		}
		if seen[t] {
			add(fmt.Sprintf("mqtt.topics[%d]", i), "%q is listed twice; remove one", t)
		}
		seen[t] = true
	}
	if !c.MQTT.AllowAnonymous && c.MQTT.UsersFile == "" && c.MQTT.TLS.ClientCAFile == "" {
		add("mqtt.users_file", "is not set and mqtt.allow_anonymous is false, so no device could connect; set mqtt.users_file to a users file of bcrypt hashes (edgegate passwd), or mqtt.tls.client_ca_file for device certificates, or (for labs and tests only) mqtt.allow_anonymous: true")
	}
	positive := func(key string, v, lo, hi int) {
		if v < lo || v > hi {
			add(key, "%d is out of range; use %d to %d", v, lo, hi)
		}
	}
	positive("mqtt.max_payload_bytes", c.MQTT.MaxPayload, 16, 16<<20)
	positive("mqtt.max_packet_bytes", c.MQTT.MaxPacket, 64, 256<<20)
	if c.MQTT.MaxPayload > c.MQTT.MaxPacket {
		add("mqtt.max_payload_bytes", "%d exceeds mqtt.max_packet_bytes (%d); a payload must fit in a packet, so lower it or raise max_packet_bytes", c.MQTT.MaxPayload, c.MQTT.MaxPacket)
	}
	positive("mqtt.client_write_queue", c.MQTT.ClientWriteQueue, 1, 65536)
	positive("mqtt.client_read_buffer_bytes", c.MQTT.ClientReadBuffer, 256, 1<<20)
	positive("mqtt.client_write_buffer_bytes", c.MQTT.ClientWriteBuffer, 256, 1<<20)
	positive("mqtt.receive_maximum", c.MQTT.ReceiveMaximum, 1, 65535)
	c.validateBounds(add)
	c.validateSecurity(add)

	positive("aggregate.max_devices", c.Aggregate.MaxDevices, 1, 10_000_000)
	positive("aggregate.max_series", c.Aggregate.MaxSeries, 1, 10_000_000)
	positive("aggregate.max_metrics_per_device", c.Aggregate.MaxMetricsPerDevice, 1, 1_000_000)
	if c.Aggregate.MaxMetricsPerDevice > c.Aggregate.MaxSeries && c.Aggregate.MaxSeries > 0 {
		add("aggregate.max_metrics_per_device", "%d exceeds aggregate.max_series (%d); lower it or raise max_series", c.Aggregate.MaxMetricsPerDevice, c.Aggregate.MaxSeries)
	}
	if _, ok := untrustedPolicies[c.Aggregate.UntrustedDeviceTime]; !ok {
		add("aggregate.untrusted_device_time", "%q is not a policy; use arrival (stamp a reading whose device clock was never set on arrival, while the gateway clock is synchronized) or deadletter", c.Aggregate.UntrustedDeviceTime)
	}
	if d := c.Aggregate.MaxDeviceSkew.D(); d != 0 && (d < time.Second || d > 24*time.Hour) {
		add("aggregate.max_device_skew", "%v is out of range; use 1s to 24h, or 0 to report no skewed device clocks", d)
	}
	if d := c.Aggregate.Window.D(); d < time.Second || d > 24*time.Hour {
		add("aggregate.window", "%s is out of range; use 1s to 24h (the default is 1m)", d)
	} else if err := c.AggregateConfig().Validate(); err != nil {
		add("aggregate", "%v", err)
	}
	if b := c.Clock.HoldMaxBytes; b != 0 && (b < 64<<10 || b > 4<<30) {
		add("clock.hold_max_bytes", "%d bytes is out of range; use 64KiB to 4GiB (the default 64MiB holds about half a million readings), or 0 to hold none and aggregate them at once, unverified", int64(b))
	}
	if d := c.Clock.HoldMaxAge.D(); d < time.Second || d > 7*24*time.Hour {
		add("clock.hold_max_age", "%v is out of range; use 1s to 168h: how long readings wait for the clock to be synchronized (their windows are late by as much)", d)
	}
	if s := c.Clock.Synchronized; s != "auto" && s != "always" {
		add("clock.synchronized", "%q is not a choice; use auto (ask the kernel, as chrony, ntpd and systemd-timesyncd keep it) or always (the clock is right whatever the kernel says: a battery-backed RTC)", s)
	}
	switch {
	case c.Kafka.Brokers == nil:
		add("kafka.brokers", "is required; list your Kafka bootstrap brokers as host:port, e.g. [kafka-1.example.com:9092]")
	case len(c.Kafka.Brokers) == 0:
		add("kafka.brokers", "is empty; list at least one Kafka bootstrap broker as host:port, e.g. [kafka-1.example.com:9092]")
	}
	for i, b := range c.Kafka.Brokers {
		checkAddr(add, fmt.Sprintf("kafka.brokers[%d]", i), b, true)
	}
	for key, v := range map[string]string{"kafka.summaries_topic": c.Kafka.SummariesTopic, "kafka.deadletter_topic": c.Kafka.DeadletterTopic, "kafka.offsets_topic": c.Kafka.OffsetsTopic} {
		if !topicRE.MatchString(v) || v == "." || v == ".." {
			add(key, "%q is not a valid Kafka topic name; use 1-249 letters, digits, '.', '_' or '-'", v)
		}
	}
	if c.Kafka.SummariesTopic == c.Kafka.DeadletterTopic {
		add("kafka.deadletter_topic", "is the same topic as kafka.summaries_topic; give dead letters their own topic")
	}
	if c.Kafka.OffsetsTopic == c.Kafka.SummariesTopic || c.Kafka.OffsetsTopic == c.Kafka.DeadletterTopic {
		add("kafka.offsets_topic", "%q is also a data topic; give delivered positions their own (compacted) topic", c.Kafka.OffsetsTopic)
	}
	switch c.Kafka.SASL.Mechanism {
	case "":
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.Kafka.SASL.Username == "" {
			add("kafka.sasl.username", "is empty; SASL %s needs a username", c.Kafka.SASL.Mechanism)
		}
		if (c.Kafka.SASL.PasswordFile == "") == (c.Kafka.SASL.PasswordEnv == "") {
			add("kafka.sasl.password_file", "set exactly one of kafka.sasl.password_file and kafka.sasl.password_env (passwords are never written in the configuration)")
		}
		if c.Kafka.SASL.Mechanism == "PLAIN" && !c.Kafka.TLS.Enabled {
			add("kafka.sasl.mechanism", "PLAIN sends the password in clear; enable kafka.tls or use SCRAM-SHA-512")
		}
	default:
		add("kafka.sasl.mechanism", "%q is not a mechanism; use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.Kafka.SASL.Mechanism)
	}
	if (c.Kafka.TLS.CertFile == "") != (c.Kafka.TLS.KeyFile == "") {
		add("kafka.tls.cert_file", "and kafka.tls.key_file go together; give both or neither")
	}
	if !c.Kafka.TLS.Enabled && (c.Kafka.TLS.CAFile != "" || c.Kafka.TLS.CertFile != "") {
		add("kafka.tls.enabled", "is false but TLS files are set; set enabled: true")
	}
	if c.Kafka.MaxRecordBytes < 4<<10 || c.Kafka.MaxRecordBytes > 64<<20 {
		add("kafka.max_record_bytes", "%d bytes is out of range; use 4KiB to 64MiB, below the brokers' message.max.bytes (Kafka's default is 1MB; the default here is 512KiB)", int64(c.Kafka.MaxRecordBytes))
	}
	if c.Kafka.RefusedMaxBytes < c.Kafka.MaxRecordBytes || c.Kafka.RefusedMaxBytes > 1<<30 {
		add("kafka.refused_max_bytes", "%d bytes is out of range; use kafka.max_record_bytes (%d, so that a refused record fits) to 1GiB; the default is 16MiB", int64(c.Kafka.RefusedMaxBytes), int64(c.Kafka.MaxRecordBytes))
	}
	if c.Kafka.MaxBatchBytes < 16<<10 || c.Kafka.MaxBatchBytes > 64<<20 {
		add("kafka.max_batch_bytes", "%d bytes is out of range; use 16KiB to 64MiB (the default is 1MiB; batches adapt to the link below it)", int64(c.Kafka.MaxBatchBytes))
	}
	if c.Kafka.StallTimeout.D() < time.Second || c.Kafka.StallTimeout.D() > 10*time.Minute {
		add("kafka.stall_timeout", "%v is out of range; use 1s to 10m (the default is 10s)", c.Kafka.StallTimeout.D())
	}
	if c.Kafka.ClientID == "" {
		add("kafka.client_id", "is empty; set e.g. edgegate")
	}
	if c.Storage.MaxBytes < 1<<20 {
		add("storage.max_bytes", "%d bytes is too small; allow at least 1MiB (the default is 1GiB)", int64(c.Storage.MaxBytes))
	}
	switch c.Storage.FullPolicy {
	case "backpressure", "drop_oldest":
	default:
		add("storage.full_policy", "%q is not a policy; use backpressure (devices keep their readings) or drop_oldest", c.Storage.FullPolicy)
	}
	if v := c.Storage.DeadLetterPayload; v < 64 || v > 64<<10 {
		add("storage.deadletter_payload_bytes", "%d is out of range; use 64 to 65536 (the default 4KiB shows what a device sent; the length and hash of the whole payload are always in the dead letter)", int64(v))
	}
	// A dead letter carries its payload base64-encoded when it is binary
	// (a third more), JSON-escaped, with up to 32 items: it must fit in a
	// Kafka record, or every such dead letter would be set aside as refused.
	if need := 2*int64(c.Storage.DeadLetterPayload) + 16<<10; c.Storage.DeadLetterPayload >= 64 && int64(c.Kafka.MaxRecordBytes) >= 4<<10 && int64(c.Kafka.MaxRecordBytes) < need {
		add("kafka.max_record_bytes", "%d bytes cannot hold a dead letter with storage.deadletter_payload_bytes %d; raise it to at least %d or lower the payload bound", int64(c.Kafka.MaxRecordBytes), int64(c.Storage.DeadLetterPayload), need)
	}
	if v := c.Storage.DeadLetterShare; !(v >= 0.01 && v <= 0.5) {
		add("storage.deadletter_share", "%v is out of range; use 0.01 to 0.5 (the default 0.1 gives dead letters 10%% of storage.max_bytes and keeps the rest for summaries)", v)
	}
	if d := c.Storage.FsyncInterval.D(); d < 0 || d > time.Second {
		add("storage.fsync_interval", "%s is out of range; use 0 (fsync as soon as a reading arrives) to 1s (the default 5ms keeps PUBACKs fast and SD card writes low)", d)
	}
	if d := c.Storage.CheckpointInterval.D(); d < 100*time.Millisecond || d > time.Hour {
		add("storage.checkpoint_interval", "%s is out of range; use 100ms to 1h (the default 10s bounds the replay at restart)", d)
	}
	if c.HTTP.Listen != "" {
		checkAddr(add, "http.listen", c.HTTP.Listen, false)
	}
	onBus := map[string]bool{}
	for i, s := range c.Sensors {
		key := fmt.Sprintf("sensors[%d]", i)
		if s.Bus == "" {
			add(key+".bus", "is empty; name the I2C bus (/dev/i2c-1, or emulated for simulated chips)")
		}
		if s.Address < 0x03 || s.Address > 0x77 {
			add(key+".address", "%#x is not a 7-bit device address; use 0x03…0x77 (%s)", s.Address, driverAddresses())
		}
		driver, ok := devices.Lookup(s.Driver)
		if !ok {
			add(key+".driver", "%q is not a driver; use %s", s.Driver, driverNames())
		}
		metrics := driver.MetricNames()
		if d := s.Every.D(); d < 100*time.Millisecond || d > 24*time.Hour {
			add(key+".interval", "%s is out of range; use 100ms to 24h", d)
		}
		if !idRE.MatchString(s.Device) {
			add(key+".device", "%q is not a valid device id; use 1-64 letters, digits, '.', '_' or '-'", s.Device)
		}
		for m, name := range s.Metrics {
			if !slices.Contains(metrics, m) {
				add(key+".metrics."+m, "%s does not report %q; it reports %s", s.Driver, m, strings.Join(metrics, ", "))
			}
			if name == "" || strings.ContainsAny(name, "/+#") {
				add(key+".metrics."+m, "%q is not a metric name (no '/', '+' or '#')", name)
			}
		}
		if at := fmt.Sprintf("%s@%#x", s.Bus, s.Address); onBus[at] {
			add(key+".address", "%#x on bus %s is listed twice", s.Address, s.Bus)
		} else {
			onBus[at] = true
		}
	}
	if _, ok := c.SensorTopic("d", "m"); len(c.Sensors) > 0 && !ok {
		add("sensors", "need an mqtt.topics pattern with {device} and {metric} (e.g. sensors/{device}/{metric}) to report readings under")
	}
	c.validateSparkplug(add)
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "%q is not a level; use debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "%q is not a format; use text or json", c.Log.Format)
	}
	return p.sorted()
}

// validateSecurity checks the listeners, the ACL and the limits.
func (c *Config) validateSecurity(add func(string, string, ...any)) {
	m := &c.MQTT
	if m.Listen == "" && m.TLS.Listen == "" && m.WebSocket.Listen == "" {
		add("mqtt.listen", "is empty and so are mqtt.tls.listen and mqtt.websocket.listen; devices could not connect")
	}
	if m.TLS.Listen != "" {
		checkAddr(add, "mqtt.tls.listen", m.TLS.Listen, false)
	}
	if m.WebSocket.Listen != "" {
		checkAddr(add, "mqtt.websocket.listen", m.WebSocket.Listen, false)
	}
	for i, o := range m.WebSocket.AllowedOrigins {
		if err := CheckOrigin(o); err != nil {
			add(fmt.Sprintf("mqtt.websocket.allowed_origins[%d]", i), "%v", err)
		}
	}
	if (m.TLS.Listen != "" || m.WebSocket.TLS) && (m.TLS.CertFile == "" || m.TLS.KeyFile == "") {
		add("mqtt.tls.cert_file", "and mqtt.tls.key_file are required for a TLS listener; give the PEM files of the server certificate and its key")
	}
	if m.TLS.RequireClientCert && m.TLS.ClientCAFile == "" {
		add("mqtt.tls.require_client_cert", "needs mqtt.tls.client_ca_file, the CA that signs device certificates")
	}
	roles := c.Roles()
	for name, r := range roles {
		for i, f := range r.Publish {
			if err := CheckACLFilter(f); err != nil {
				add(fmt.Sprintf("mqtt.acl.roles.%s.publish[%d]", name, i), "%v", err)
			}
		}
		for i, f := range r.Subscribe {
			if err := CheckACLFilter(f); err != nil {
				add(fmt.Sprintf("mqtt.acl.roles.%s.subscribe[%d]", name, i), "%v", err)
			}
		}
		for i, f := range r.DenyPublish {
			if err := CheckACLFilter(f); err != nil {
				add(fmt.Sprintf("mqtt.acl.roles.%s.deny_publish[%d]", name, i), "%v", err)
			}
		}
		for i, f := range r.DenySubscribe {
			if err := CheckACLFilter(f); err != nil {
				add(fmt.Sprintf("mqtt.acl.roles.%s.deny_subscribe[%d]", name, i), "%v", err)
			}
		}
	}
	names := slices.Sorted(maps.Keys(roles))
	for user, role := range m.ACL.Users {
		if _, ok := roles[role]; !ok {
			add("mqtt.acl.users."+user, "role %q is not defined; use one of %s or add it under mqtt.acl.roles", role, strings.Join(names, ", "))
		}
	}
	for name, role := range m.ACL.Certificates {
		if _, ok := roles[role]; !ok {
			add("mqtt.acl.certificates."+name, "role %q is not defined; use one of %s or add it under mqtt.acl.roles", role, strings.Join(names, ", "))
		}
	}
	if len(m.ACL.Certificates) > 0 && m.TLS.ClientCAFile == "" {
		add("mqtt.acl.certificates", "gives certificates roles, but mqtt.tls.client_ca_file is not set, so no certificate is verified; set it or remove the entries")
	}
	if _, ok := roles[m.ACL.AnonymousRole]; !ok {
		add("mqtt.acl.anonymous_role", "role %q is not defined; use one of %s", m.ACL.AnonymousRole, strings.Join(names, ", "))
	}
	between := func(key string, v, lo, hi int) {
		if v < lo || v > hi {
			add(key, "%d is out of range; use %d to %d", v, lo, hi)
		}
	}
	between("mqtt.topic_alias_maximum", m.TopicAliasMaximum, 0, 65535)
	between("mqtt.max_clients", m.MaxClients, 1, 1_000_000)
	between("mqtt.max_sessions", m.MaxSessions, 1, 1_000_000)
	if m.MaxSessionsPerIdentity < 1 || m.MaxSessionsPerIdentity > m.MaxSessions {
		add("mqtt.max_sessions_per_identity", "%d is out of range; use 1 to mqtt.max_sessions (%d)", m.MaxSessionsPerIdentity, m.MaxSessions)
	}
	switch m.DeviceClientIDs {
	case "prefixed", "identity", "any":
	default:
		add("mqtt.device_client_ids", "%q is not a rule; use prefixed (the identity, or the identity, ':' and anything), identity (the identity only) or any (no binding: a device may take over another's session)", m.DeviceClientIDs)
	}
	between("mqtt.max_subscriptions_per_client", m.MaxSubscriptions, 1, 100_000)
	if d := m.MaxSessionExpiry.D(); d < 0 || d > 365*24*time.Hour {
		add("mqtt.max_session_expiry", "%s is out of range; use 0 (sessions end with their connection) to 8760h", d)
	}
	if d := m.ConnectTimeout.D(); d < 100*time.Millisecond || d > 5*time.Minute {
		add("mqtt.connect_timeout", "%s is out of range; use 100ms to 5m (a socket that has not sent CONNECT by then is closed)", d)
	}
	between("mqtt.max_pending_connects", m.MaxPendingConnects, 1, 1_000_000)
	if m.MaxPendingConnectsPerAddress < 1 || m.MaxPendingConnectsPerAddress > m.MaxPendingConnects {
		add("mqtt.max_pending_connects_per_address", "%d is out of range; use 1 to mqtt.max_pending_connects (%d)", m.MaxPendingConnectsPerAddress, m.MaxPendingConnects)
	}
	if d := m.MaxKeepAlive.D(); d < time.Second || d > 18*time.Hour {
		add("mqtt.max_keep_alive", "%s is out of range; use 1s to 18h (MQTT's keep alive is at most 65535 s)", d)
	}
	if d := m.WriteTimeout.D(); d < 100*time.Millisecond || d > 5*time.Minute {
		add("mqtt.write_timeout", "%s is out of range; use 100ms to 5m (a client that takes longer to accept one write is disconnected)", d)
	}
	if d := m.ReceiptMargin.D(); d < 100*time.Millisecond || d > 10*time.Minute {
		add("mqtt.receipt_margin", "%s is out of range; use 100ms to 10m (above the longest a TCP proxy between the devices and the gateway may hold data)", d)
	}
	if m.ConnectRate < 0 {
		add("mqtt.connect_rate_per_address", "%g is negative; use 0 (no limit) or connections per second", m.ConnectRate)
	}
	if m.ConnectRate > 0 && m.ConnectBurst < 1 {
		add("mqtt.connect_burst_per_address", "%d is too small; allow at least 1 connection at once", m.ConnectBurst)
	}
	for i, n := range m.ConnectRateExempt {
		if _, err := netip.ParsePrefix(n); err != nil {
			add(fmt.Sprintf("mqtt.connect_rate_exempt[%d]", i), "%q is not a network; write it as 10.0.0.0/8 or ::1/128", n)
		}
	}
	if m.MaxPasswordChecks < 0 || m.MaxPasswordChecks > 1024 {
		add("mqtt.max_password_checks", "%d is out of range; use 0 (half the cores) or 1 to 1024 bcrypt comparisons at once", m.MaxPasswordChecks)
	}
	if m.PingRate < 0 {
		add("mqtt.ping_rate_per_client", "%g is negative; use 0 (no limit) or PINGREQs per second", m.PingRate)
	}
	if m.PublishRate < 0 {
		add("mqtt.publish_rate_per_client", "%g is negative; use 0 (no limit) or publications per second", m.PublishRate)
	}
	if m.PublishBytesRate < 0 {
		add("mqtt.publish_bytes_rate_per_client", "%d is negative; use 0 (no limit) or bytes per second", m.PublishBytesRate)
	}
	if m.PublishBytesRate > 0 && m.PublishBytesBurst < ByteSize(m.MaxPacket) {
		add("mqtt.publish_bytes_burst_per_client", "%d is less than mqtt.max_packet_bytes (%d): a burst must hold the largest publication; raise it", m.PublishBytesBurst, m.MaxPacket)
	}
}

// SparkplugHostID returns the Sparkplug host id: sparkplug.host_id, or
// gateway.id.
func (c *Config) SparkplugHostID() string {
	if c.Sparkplug.HostID != "" {
		return c.Sparkplug.HostID
	}
	return c.Gateway.ID
}

// sparkplugLevel reports whether s can be one level of a Sparkplug topic
// (Sparkplug 3.0 §4.1: no '/', '+' or '#').
func sparkplugLevel(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '/' || r == '+' || r == '#' {
			return false
		}
	}
	return true
}

// validateSparkplug checks the sparkplug section.
func (c *Config) validateSparkplug(add func(string, string, ...any)) {
	sp := &c.Sparkplug
	if sp.HostID != "" && !idRE.MatchString(sp.HostID) {
		add("sparkplug.host_id", "%q is not a valid host id; use 1-64 letters, digits, '.', '_' or '-' (it is a topic level: spBv1.0/STATE/<host_id>), or leave it empty for gateway.id", sp.HostID)
	}
	seen := map[string]bool{}
	for i, g := range sp.Groups {
		key := fmt.Sprintf("sparkplug.groups[%d]", i)
		if !sparkplugLevel(g) {
			add(key, "%q is not a Sparkplug group id; a group id is one topic level: not empty, no '/', '+', '#' or control characters", g)
		}
		if seen[g] {
			add(key, "%q is listed twice; remove one", g)
		}
		seen[g] = true
	}
	if d := sp.RebirthInterval.D(); d < time.Second || d > time.Hour {
		add("sparkplug.rebirth_interval", "%s is out of range; use 1s to 1h (the default is 10s: an edge node is asked to rebirth at most that often)", d)
	}
	if sep := sp.DeviceSeparator; sep == "" || len(sep) > 4 || strings.ContainsAny(sep, "+#") || strings.IndexFunc(sep, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		add("sparkplug.device_separator", "%q is not a separator; use 1 to 4 printable ASCII characters other than '+' and '#', e.g. \"/\" (the default) or \":\"", sep)
	}
	if sp.MaxNodes < 1 || sp.MaxNodes > 1_000_000 {
		add("sparkplug.max_nodes", "%d is out of range; use 1 to 1000000 (the default is 1000)", sp.MaxNodes)
	}
	if sp.MaxMetricsPerNode < 1 || sp.MaxMetricsPerNode > 1_000_000 {
		add("sparkplug.max_metrics_per_node", "%d is out of range; use 1 to 1000000 (the default is 10000)", sp.MaxMetricsPerNode)
	}
	if sp.MaxDevicesPerNode < 1 || sp.MaxDevicesPerNode > 100_000 {
		add("sparkplug.max_devices_per_node", "%d is out of range; use 1 to 100000 (the default is 100)", sp.MaxDevicesPerNode)
	}
	if sp.MaxMetrics < 1 || sp.MaxMetrics > 10_000_000 {
		add("sparkplug.max_metrics", "%d is out of range; use 1 to 10000000 (the default is 100000: about 14 MiB of host state)", sp.MaxMetrics)
	} else if sp.MaxMetrics < sp.MaxMetricsPerNode && sp.MaxMetricsPerNode <= 1_000_000 {
		add("sparkplug.max_metrics", "%d is below sparkplug.max_metrics_per_node (%d); raise it to at least that, or lower max_metrics_per_node", sp.MaxMetrics, sp.MaxMetricsPerNode)
	}
	if d := sp.ForgetAfter.D(); d < time.Minute || d > 365*24*time.Hour {
		add("sparkplug.forget_after", "%s is out of range; use 1m to 8760h (the default is 24h: a dead edge node is listed that long)", d)
	}
	if !sp.Enabled {
		return
	}
	for i, t := range c.MQTT.Topics {
		if t == sparkplug.Namespace || strings.HasPrefix(t, sparkplug.Namespace+"/") {
			add(fmt.Sprintf("mqtt.topics[%d]", i), "%q is in the Sparkplug namespace, which sparkplug.enabled reads itself; remove the pattern", t)
		}
	}
}

// Warnings lists settings that are valid but unsafe on a network.
func (c *Config) Warnings() []string {
	var w []string
	exposed := func(addr string) bool {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host == "localhost" {
			return false
		}
		ip, err := netip.ParseAddr(host)
		return err != nil || !ip.IsLoopback()
	}
	if exposed(c.MQTT.Listen) {
		w = append(w, fmt.Sprintf("mqtt.listen: %s is reachable from the network without TLS: passwords and readings cross it in clear; use mqtt.tls.listen, or listen on 127.0.0.1", c.MQTT.Listen))
	}
	if c.MQTT.WebSocket.Listen != "" && !c.MQTT.WebSocket.TLS && exposed(c.MQTT.WebSocket.Listen) {
		w = append(w, fmt.Sprintf("mqtt.websocket.listen: %s is reachable from the network without TLS; set mqtt.websocket.tls: true", c.MQTT.WebSocket.Listen))
	}
	if c.MQTT.AllowAnonymous && (exposed(c.MQTT.Listen) || exposed(c.MQTT.TLS.Listen) || exposed(c.MQTT.WebSocket.Listen)) {
		w = append(w, fmt.Sprintf("mqtt.allow_anonymous: anyone who can reach a network listener may connect, with role %q; set it false and give devices credentials", c.MQTT.ACL.AnonymousRole))
	}
	if c.MQTT.AllowAnonymous && c.MQTT.ACL.AnonymousRole != "device" {
		w = append(w, fmt.Sprintf("mqtt.acl.anonymous_role: anonymous clients get role %q whatever client id they send, so each may do all that role allows (with admin: publish as any device, read everything); the default, device, keeps each to the readings of its own client id", c.MQTT.ACL.AnonymousRole))
	}
	if c.MQTT.DeviceClientIDs == "any" {
		w = append(w, "mqtt.device_client_ids: any: a device may connect with another device's client id, taking over its session and disconnecting it; the default, prefixed, binds client ids to identities")
	}
	if c.MQTT.WebSocket.Listen != "" && slices.Contains(c.MQTT.WebSocket.AllowedOrigins, "*") {
		w = append(w, "mqtt.websocket.allowed_origins: \"*\" lets every web page a browser on the network shows connect; list the origins of your dashboards instead")
	}
	if c.MQTT.TLS.Listen != "" && c.MQTT.TLS.ClientCAFile == "" && c.MQTT.UsersFile == "" && !c.MQTT.AllowAnonymous {
		w = append(w, "mqtt.tls: no client_ca_file and no users_file: no client can authenticate")
	}
	return w
}

// Roles returns the ACL roles: the built-in ones, as replaced or added to
// by mqtt.acl.roles.
//
//   - device: publish on the reading topics (mqtt.topics) under its own
//     identity; subscribe to its own commands (commands/{username}/#).
//   - subscriber: subscribe to the reading topics of every device.
//   - admin: publish and subscribe anywhere, $SYS included.
func (c *Config) Roles() map[string]Role {
	var own, all []string
	for _, t := range c.MQTT.Topics {
		own = append(own, strings.NewReplacer("{device}", "{username}", "{metric}", "+").Replace(t))
		all = append(all, strings.NewReplacer("{device}", "+", "{metric}", "+").Replace(t))
	}
	devSub := []string{"commands/{username}/#"}
	if c.Sparkplug.Enabled {
		// A Sparkplug edge node's identity is its edge node id: it may
		// publish its own BIRTH, DATA and DEATH (and its devices'), in
		// any group, and read its commands and the host's STATE; only the
		// host (the gateway) and admins send NCMD and DCMD.
		for _, typ := range []string{"NBIRTH", "NDATA", "NDEATH"} {
			own = append(own, sparkplug.Namespace+"/+/"+typ+"/{username}")
		}
		for _, typ := range []string{"DBIRTH", "DDATA", "DDEATH"} {
			own = append(own, sparkplug.Namespace+"/+/"+typ+"/{username}/+")
		}
		devSub = append(devSub, sparkplug.Namespace+"/+/NCMD/{username}/#", sparkplug.Namespace+"/+/DCMD/{username}/#",
			sparkplug.StateTopic(c.SparkplugHostID()))
		all = append(all, sparkplug.Namespace+"/#")
	}
	roles := map[string]Role{
		"device":     {Publish: own, Subscribe: devSub},
		"subscriber": {Subscribe: all},
		"admin":      {Publish: []string{"#"}, Subscribe: []string{"#", "$SYS/#"}},
	}
	maps.Copy(roles, c.MQTT.ACL.Roles)
	return roles
}

// CheckOrigin reports whether o is a web origin as browsers send it
// (scheme://host[:port], no path; RFC 6454) or "*".
func CheckOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q is not a web origin; write scheme://host[:port] as the browser's address bar shows it, e.g. https://dashboard.example.com:8443 (or \"*\" for any)", o)
	}
	return nil
}

// CheckACLFilter reports whether f is a valid MQTT topic filter in which
// {username} and {clientid} each fill a whole level.
func CheckACLFilter(f string) error {
	if f == "" {
		return errors.New("empty filter")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return fmt.Errorf("%q: '#' must be the last level", f)
		case l == "#", l == "+", l == "{username}", l == "{clientid}":
		case strings.ContainsAny(l, "+#{}"):
			return fmt.Errorf("%q: level %q mixes a wildcard or placeholder with text; use {username}, {clientid}, + or # as whole levels", f, l)
		}
	}
	return nil
}

// CheckFiles checks that the files the configuration names can be read.
// It is separate from Validate so that a configuration can be checked on a
// machine other than the gateway.
func (c *Config) CheckFiles() error {
	var errs []error
	open := func(key, path, fix string) {
		if path == "" {
			return
		}
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w; %s", key, err, fix))
			return
		}
		f.Close()
	}
	open("mqtt.users_file", c.MQTT.UsersFile, "create it (edgegate passwd) or fix the path")
	open("mqtt.tls.cert_file", c.MQTT.TLS.CertFile, "fix the path")
	open("mqtt.tls.key_file", c.MQTT.TLS.KeyFile, "fix the path")
	open("mqtt.tls.client_ca_file", c.MQTT.TLS.ClientCAFile, "fix the path")
	open("kafka.tls.ca_file", c.Kafka.TLS.CAFile, "fix the path")
	open("kafka.tls.cert_file", c.Kafka.TLS.CertFile, "fix the path")
	open("kafka.tls.key_file", c.Kafka.TLS.KeyFile, "fix the path")
	if c.Kafka.SASL.Mechanism != "" {
		if _, err := c.Kafka.SASL.Password(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func checkAddr(add func(string, string, ...any), key, addr string, needHost bool) {
	eg := "0.0.0.0:1883"
	if needHost {
		eg = "kafka-1.example.com:9092"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		add(key, "%q is not host:port; write it as host:port, e.g. %s", addr, eg)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		add(key, "%q: port %q is not a number from 0 to 65535; write it as host:port, e.g. %s", addr, port, eg)
	}
	if needHost && host == "" {
		add(key, "%q has no host; write host:port", addr)
	}
}

// Marshal returns the effective configuration as YAML.
func (c *Config) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// validateBounds checks the bounds of what the broker holds for clients:
// retained messages and messages queued for sessions.
func (c *Config) validateBounds(add func(key, format string, args ...any)) {
	m := c.MQTT
	if m.MaxRetained < 0 || m.MaxRetained > 10_000_000 {
		add("mqtt.max_retained", "%d is out of range; use 0 (retain nothing) to 10000000", m.MaxRetained)
	}
	if m.MaxRetainedPerIdentity < 0 || m.MaxRetainedPerIdentity > m.MaxRetained {
		add("mqtt.max_retained_per_identity", "%d is out of range; use 0 (retain nothing) to mqtt.max_retained (%d)", m.MaxRetainedPerIdentity, m.MaxRetained)
	}
	if m.MaxRetainedBytes < 0 || m.MaxRetainedBytes > 4<<30 {
		add("mqtt.max_retained_bytes", "%d bytes is out of range; use 0 (retain nothing) to 4GiB (the default is 32MiB)", int64(m.MaxRetainedBytes))
	}
	if m.MaxRetainedBytesPerIdentity < 0 || m.MaxRetainedBytesPerIdentity > m.MaxRetainedBytes {
		add("mqtt.max_retained_bytes_per_identity", "%d bytes is out of range; use 0 (retain nothing) to mqtt.max_retained_bytes (%d)", int64(m.MaxRetainedBytesPerIdentity), int64(m.MaxRetainedBytes))
	}
	// A session must be able to hold one message of the largest packet.
	if m.MaxQueuedBytes < ByteSize(m.MaxPacket) || m.MaxQueuedBytes > 16<<30 {
		add("mqtt.max_queued_bytes", "%d bytes is out of range; use mqtt.max_packet_bytes (%d) to 16GiB (the default is 64MiB)", int64(m.MaxQueuedBytes), m.MaxPacket)
	}
	if m.MaxQueuedBytesPerSession < ByteSize(m.MaxPacket) || m.MaxQueuedBytesPerSession > m.MaxQueuedBytes {
		add("mqtt.max_queued_bytes_per_session", "%d bytes is out of range; use mqtt.max_packet_bytes (%d) to mqtt.max_queued_bytes (%d), so that a session can hold one message of the largest packet", int64(m.MaxQueuedBytesPerSession), m.MaxPacket, int64(m.MaxQueuedBytes))
	}
}
