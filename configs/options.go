package configs

import (
	"periph.io/x/conn/v3/i2c"

	"github.com/edgegate/edgegate/gateway"
	"github.com/edgegate/edgegate/gateway/broker"
	"github.com/edgegate/edgegate/gateway/sensors"
	"github.com/edgegate/edgegate/gateway/sparkplug"
)

// GatewayOptions returns the gateway's options from a validated
// configuration. The gateway knows nothing of this file's format: each
// component takes options in its own terms, and this is where the keys
// map onto them (as AggregateConfig does for the aggregator). openBus
// opens an I²C bus by name for the sensors (periph's i2creg.Open).
func (c *Config) GatewayOptions(openBus func(name string) (i2c.BusCloser, error)) gateway.Options {
	m := c.MQTT
	roles := map[string]broker.Filters{}
	for name, r := range c.Roles() {
		roles[name] = broker.Filters{Publish: r.Publish, Subscribe: r.Subscribe, DenyPublish: r.DenyPublish, DenySubscribe: r.DenySubscribe}
	}
	var ss []sensors.Sensor
	for _, s := range c.Sensors {
		ss = append(ss, sensors.Sensor{Driver: s.Driver, Bus: s.Bus, Address: uint16(s.Address), Device: s.Device,
			Every: s.Every.D(), Rename: s.Metrics})
	}
	var sp *sparkplug.Options
	if c.Sparkplug.Enabled {
		sp = &sparkplug.Options{HostID: c.SparkplugHostID(), Groups: c.Sparkplug.Groups, RebirthInterval: c.Sparkplug.RebirthInterval.D(),
			Separator: c.Sparkplug.DeviceSeparator, Booleans: c.Sparkplug.Booleans, MaxNodes: c.Sparkplug.MaxNodes,
			MaxMetricsPerNode: c.Sparkplug.MaxMetricsPerNode, MaxDevicesPerNode: c.Sparkplug.MaxDevicesPerNode,
			MaxMetrics: c.Sparkplug.MaxMetrics, ForgetAfter: c.Sparkplug.ForgetAfter.D()}
	}
	return gateway.Options{
		Sparkplug:          sp,
		DataDir:            c.Gateway.DataDir,
		Topics:             m.Topics,
		MaxPayload:         m.MaxPayload,
		DeadLetterPayload:  int(c.Storage.DeadLetterPayload),
		Aggregate:          c.AggregateConfig(),
		FsyncInterval:      c.Storage.FsyncInterval.D(),
		CheckpointInterval: c.Storage.CheckpointInterval.D(),
		Broker: broker.Options{
			Listen: m.Listen,
			TLS: broker.TLSOptions{Listen: m.TLS.Listen, CertFile: m.TLS.CertFile, KeyFile: m.TLS.KeyFile,
				ClientCAFile: m.TLS.ClientCAFile, RequireClientCert: m.TLS.RequireClientCert},
			WebSocket:              broker.WebSocketOptions{Listen: m.WebSocket.Listen, TLS: m.WebSocket.TLS, AllowedOrigins: m.WebSocket.AllowedOrigins},
			AllowAnonymous:         m.AllowAnonymous,
			UsersFile:              m.UsersFile,
			Roles:                  roles,
			Users:                  m.ACL.Users,
			CertRoles:              m.ACL.Certificates,
			AnonymousRole:          m.ACL.AnonymousRole,
			MaxPacket:              m.MaxPacket,
			ReceiveMaximum:         m.ReceiveMaximum,
			ClientWriteQueue:       m.ClientWriteQueue,
			ClientReadBuffer:       m.ClientReadBuffer,
			ClientWriteBuffer:      m.ClientWriteBuffer,
			TopicAliasMaximum:      m.TopicAliasMaximum,
			MaxSessionExpiry:       m.MaxSessionExpiry.D(),
			MaxSessions:            m.MaxSessions,
			MaxSessionsPerIdentity: m.MaxSessionsPerIdentity,
			ClientIDs:              broker.ClientIDRule(m.DeviceClientIDs),
			MaxClients:             m.MaxClients,
			MaxSubscriptions:       m.MaxSubscriptions,
			ConnectTimeout:         m.ConnectTimeout.D(),
			ConnectRate:            m.ConnectRate,
			ConnectBurst:           m.ConnectBurst,
			ConnectRateExempt:      m.ConnectRateExempt,
			PublishRate:            m.PublishRate,
			PublishBytesRate:       float64(m.PublishBytesRate),
			PublishBytesBurst:      int(m.PublishBytesBurst),
			PingRate:               m.PingRate,
			MaxKeepAlive:           m.MaxKeepAlive.D(),
			PasswordChecks:         m.MaxPasswordChecks,
			WriteTimeout:           m.WriteTimeout.D(),
			ReceiptMargin:          m.ReceiptMargin.D(),

			Retained: broker.RetainedLimits{Count: m.MaxRetained, Bytes: int64(m.MaxRetainedBytes),
				PerIdentity: m.MaxRetainedPerIdentity, BytesPerIdentity: int64(m.MaxRetainedBytesPerIdentity)},
			MaxQueuedBytesPerSession: int64(m.MaxQueuedBytesPerSession),
			MaxQueuedBytes:           int64(m.MaxQueuedBytes),

			MaxPendingConnects:           m.MaxPendingConnects,
			MaxPendingConnectsPerAddress: m.MaxPendingConnectsPerAddress,
		},
		HoldMaxBytes: int64(c.Clock.HoldMaxBytes),
		HoldMaxAge:   c.Clock.HoldMaxAge.D(),
		Sensors:      ss,
		OpenBus:      openBus,
		SensorTopic: func(device, metric string) string {
			t, _ := c.SensorTopic(device, metric) // validated: a pattern exists
			return t
		},
	}
}
