package firmwaresim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"
)

// conn is a device's MQTT connection, of either protocol version.
type conn interface {
	publish(ctx context.Context, topic string, qos byte, payload []byte) error
	close()
}

// session is what a Sparkplug edge node's connection needs besides a
// plain device's: a will, and a subscription (its NCMD topic) whose
// messages go to onMsg, from the client's goroutine.
type session struct {
	will  Message
	sub   string
	onMsg func(payload []byte)
}

// dialDevice connects d with a clean session, in its protocol version;
// with sess, with its will and subscription.
func dialDevice(ctx context.Context, addr string, d Device, sess *session) (conn, error) {
	if d.Protocol == 4 || d.Protocol == 3 {
		return dial311(ctx, addr, d.ID, d.Username, d.Password, sess)
	}
	if sess == nil {
		c, err := Dial(ctx, addr, d.ID, d.Username, d.Password)
		if err != nil {
			return nil, err
		}
		return v5conn{c}, nil
	}
	var dialer net.Dialer
	nc, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: nc, ClientID: d.ID,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			sess.onMsg(r.Packet.Payload)
			return true, nil
		}}})
	cp := connectPacket(d.ID)
	cp.WillMessage = &paho.WillMessage{Topic: sess.will.Topic, Payload: sess.will.Payload, QoS: 1}
	if d.Username != "" {
		cp.Username, cp.UsernameFlag = d.Username, true
		cp.Password, cp.PasswordFlag = []byte(d.Password), true
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Connect(cctx, cp); err != nil {
		nc.Close()
		return nil, fmt.Errorf("connect %s as %s: %w", addr, d.ID, err)
	}
	if _, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: sess.sub, QoS: 0}}}); err != nil {
		c.Disconnect(&paho.Disconnect{})
		return nil, fmt.Errorf("subscribe %s to %s: %w", d.ID, sess.sub, err)
	}
	return v5conn{c}, nil
}

type v5conn struct{ c *paho.Client }

func (v v5conn) publish(ctx context.Context, topic string, qos byte, payload []byte) error {
	_, err := v.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: payload})
	return err
}

func (v v5conn) close() { v.c.Disconnect(&paho.Disconnect{}) }

// v311 is an MQTT 3.1.1 connection through eclipse/paho.mqtt.golang, with
// its own reconnection off: the device decides when to reconnect.
type v311 struct{ c mqtt3.Client }

func dial311(ctx context.Context, addr, id, user, pass string, sess *session) (conn, error) {
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetProtocolVersion(4).
		SetCleanSession(true).SetKeepAlive(30 * time.Second).SetAutoReconnect(false).SetConnectRetry(false).
		SetOrderMatters(true).SetConnectTimeout(10 * time.Second).SetWriteTimeout(10 * time.Second)
	if user != "" {
		o.SetUsername(user).SetPassword(pass)
	}
	if sess != nil {
		o.SetBinaryWill(sess.will.Topic, sess.will.Payload, 1, false)
	}
	c := mqtt3.NewClient(o)
	t := c.Connect()
	if err := waitToken(ctx, t); err != nil {
		return nil, fmt.Errorf("connect %s as %s (MQTT 3.1.1): %w", addr, id, err)
	}
	if sess != nil {
		st := c.Subscribe(sess.sub, 0, func(_ mqtt3.Client, m mqtt3.Message) { sess.onMsg(m.Payload()) })
		if err := waitToken(ctx, st); err != nil {
			c.Disconnect(100)
			return nil, fmt.Errorf("subscribe %s to %s (MQTT 3.1.1): %w", id, sess.sub, err)
		}
	}
	return v311{c}, nil
}

func (v v311) publish(ctx context.Context, topic string, qos byte, payload []byte) error {
	if !v.c.IsConnectionOpen() {
		return errors.New("connection lost")
	}
	return waitToken(ctx, v.c.Publish(topic, qos, false, payload))
}

func (v v311) close() { v.c.Disconnect(100) }

func waitToken(ctx context.Context, t mqtt3.Token) error {
	select {
	case <-t.Done():
		return t.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dialSubscriber connects an MQTT 5 client that hands every publication to
// onPub and closes lost when the connection ends.
func dialSubscriber(ctx context.Context, addr string, s Subscriber, onPub func()) (*paho.Client, <-chan struct{}, error) {
	runCtx := ctx
	var dialer net.Dialer
	nc, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	lost := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(lost) }) }
	c := paho.NewClient(paho.ClientConfig{Conn: nc, ClientID: s.ID,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			onPub()
			sleepCtx(runCtx, s.Delay)
			return true, nil
		}},
		OnClientError:      func(error) { end() },
		OnServerDisconnect: func(*paho.Disconnect) { end() },
	})
	cp := connectPacket(s.ID)
	if s.Username != "" {
		cp.Username, cp.UsernameFlag = s.Username, true
		cp.Password, cp.PasswordFlag = []byte(s.Password), true
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Connect(cctx, cp); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("connect %s as %s: %w", addr, s.ID, err)
	}
	if _, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: s.Filter, QoS: 1}}}); err != nil {
		c.Disconnect(&paho.Disconnect{})
		return nil, nil, fmt.Errorf("subscribe %s to %s: %w", s.ID, s.Filter, err)
	}
	return c, lost, nil
}
