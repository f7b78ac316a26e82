package auth

import (
	"fmt"
	"strings"
)

// Placeholder levels in ACL filters, replaced by the client's identity or
// client id when a topic is checked.
const (
	levelUsername = "{username}"
	levelClientID = "{clientid}"
)

// Filters is a set of topic filters, in which {username} stands for the
// client's identity and {clientid} for its client id, each filling whole
// topic levels. The deny filters win over the others.
type Filters struct {
	Publish, Subscribe         []string
	DenyPublish, DenySubscribe []string
}

// Role is a compiled set of Filters.
type Role struct {
	Name             string
	pub, sub         [][]string // filters split into levels
	denyPub, denySub [][]string
}

// ACL decides what each client may publish to and subscribe to.
// Usernames and certificate names are separate namespaces: each has its
// own map to roles, and whoever is in neither is a device.
type ACL struct {
	Roles     map[string]*Role
	users     map[string]*Role // username → role
	certs     map[string]*Role // certificate name → role
	Anonymous *Role
}

func NewACL(roles map[string]Filters, users, certs map[string]string, anonymous string) (*ACL, error) {
	a := &ACL{Roles: map[string]*Role{}, users: map[string]*Role{}, certs: map[string]*Role{}}
	for name, r := range roles {
		ar := &Role{Name: name}
		for _, f := range r.Publish {
			ar.pub = append(ar.pub, strings.Split(f, "/"))
		}
		for _, f := range r.Subscribe {
			ar.sub = append(ar.sub, strings.Split(f, "/"))
		}
		for _, f := range r.DenyPublish {
			ar.denyPub = append(ar.denyPub, strings.Split(f, "/"))
		}
		for _, f := range r.DenySubscribe {
			ar.denySub = append(ar.denySub, strings.Split(f, "/"))
		}
		a.Roles[name] = ar
	}
	for user, role := range users {
		r, ok := a.Roles[role]
		if !ok {
			return nil, fmt.Errorf("mqtt.acl.users.%s: no role %q", user, role)
		}
		a.users[user] = r
	}
	for name, role := range certs {
		r, ok := a.Roles[role]
		if !ok {
			return nil, fmt.Errorf("mqtt.acl.certificates.%s: no role %q", name, role)
		}
		a.certs[name] = r
	}
	var ok bool
	if a.Anonymous, ok = a.Roles[anonymous]; !ok {
		return nil, fmt.Errorf("mqtt.acl.anonymous_role: no role %q", anonymous)
	}
	if a.Roles["device"] == nil {
		return nil, fmt.Errorf("mqtt.acl.roles: the device role is needed")
	}
	return a, nil
}

// UserRole returns the role of a user of the users file.
func (a *ACL) UserRole(user string) *Role {
	if r, ok := a.users[user]; ok {
		return r
	}
	return a.Roles["device"]
}

// CertRole returns the role of a verified client certificate's name.
func (a *ACL) CertRole(name string) *Role {
	if r, ok := a.certs[name]; ok {
		return r
	}
	return a.Roles["device"]
}

// DeniedAway reports whether a message on topic is to be kept from the
// persistent session of a client that is away (mochi queues its QoS 1/2
// messages and sends them when it returns, unasked): a deny_subscribe
// filter of its role matches topic. The client's identity was name
// (empty: an anonymous client, whose identity is its client id cid);
// whether name was a username or a certificate's is not kept with the
// session, so the denials of either role apply.
func (a *ACL) DeniedAway(topic, name, cid string) bool {
	if name == "" {
		return a.Anonymous.denied(topic, cid, cid)
	}
	return a.UserRole(name).denied(topic, name, cid) || a.CertRole(name).denied(topic, name, cid)
}

// CanPublish reports whether a client with identity user and client id
// cid may publish to topic: a publish filter of the role matches it, and
// no deny_publish filter does.
func (r *Role) CanPublish(topic, user, cid string) bool {
	for _, f := range r.denyPub {
		if matchTopic(f, topic, user, cid) {
			return false
		}
	}
	for _, f := range r.pub {
		if matchTopic(f, topic, user, cid) {
			return true
		}
	}
	return false
}

// CanRead reports whether a message on topic may be delivered to the
// client: a subscribe filter of the role matches it, and no
// deny_subscribe filter does. A subscription the role may make can match
// denied topics ("#" with "secret/#" denied): their messages are kept
// from it here.
func (r *Role) CanRead(topic, user, cid string) bool {
	if r.denied(topic, user, cid) {
		return false
	}
	for _, f := range r.sub {
		if matchTopic(f, topic, user, cid) {
			return true
		}
	}
	return false
}

// denied reports whether a deny_subscribe filter of the role matches
// topic.
func (r *Role) denied(topic, user, cid string) bool {
	for _, f := range r.denySub {
		if matchTopic(f, topic, user, cid) {
			return true
		}
	}
	return false
}

// CanSubscribe reports whether the subscription filter req lies within one
// of the role's subscribe filters (every topic req matches, the allowed
// filter matches too) and not within a deny_subscribe filter (which would
// keep every message of the subscription from it). One that matches some
// denied topics is granted: CanRead keeps their messages from it.
func (r *Role) CanSubscribe(req, user, cid string) bool {
	for _, f := range r.denySub {
		if within(f, req, user, cid) {
			return false
		}
	}
	for _, f := range r.sub {
		if within(f, req, user, cid) {
			return true
		}
	}
	return false
}

// IdentityLevel reports whether s can stand for a placeholder: one whole
// level, no wildcard, not empty.
func IdentityLevel(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/+#")
}

// fill returns the literal an ACL level stands for, or level itself.
func fill(level, user, cid string) (string, bool) {
	switch level {
	case levelUsername:
		return user, IdentityLevel(user)
	case levelClientID:
		return cid, IdentityLevel(cid)
	}
	return level, true
}

// sysTopic reports whether a topic or filter is under $SYS, as mochi
// tells it (case-insensitively; it drops client publications there).
func sysTopic(s string) bool {
	return len(s) >= len("$SYS") && strings.EqualFold(s[:len("$SYS")], "$SYS")
}

// matchTopic matches a topic name against a split ACL filter without
// allocating. A filter starting with a wildcard covers topics starting
// with '$' (an application's own "$app/..." namespace: admin's "#" may
// publish there), except $SYS, the broker's own, which a filter must
// name. (Subscriptions match by MQTT's rule, where a leading wildcard
// matches no '$' topic [MQTT-4.7.2-1]; mochi applies it before asking.)
func matchTopic(f []string, topic, user, cid string) bool {
	if sysTopic(topic) && len(f) > 0 && (f[0] == "#" || f[0] == "+") {
		return false
	}
	rest, done := topic, false
	for _, fl := range f {
		if fl == "#" {
			return true // also matches the parent level: "a/#" matches "a"
		}
		if done {
			return false
		}
		level, tail, more := strings.Cut(rest, "/")
		if fl != "+" {
			if want, ok := fill(fl, user, cid); !ok || want != level {
				return false
			}
		}
		rest, done = tail, !more
	}
	return done
}

// within reports whether every topic matched by filter req is matched by
// the ACL filter f.
func within(f []string, req, user, cid string) bool {
	rl := strings.Split(req, "/")
	if strings.HasPrefix(req, "$share/") {
		// A shared subscription reads the topics of its filter.
		if len(rl) < 3 {
			return false
		}
		rl = rl[2:]
	}
	if len(rl) > 0 && sysTopic(rl[0]) && len(f) > 0 && (f[0] == "#" || f[0] == "+") {
		return false
	}
	if len(rl) > 0 && (rl[0] == "#" || rl[0] == "+") && len(f) > 0 && strings.HasPrefix(f[0], "$") {
		// "#" does not read $SYS, so "$SYS/#" does not cover it, but it
		// is not within "$SYS/#" either.
		return false
	}
	for i, fl := range f {
		if fl == "#" {
			return true
		}
		if i >= len(rl) {
			return false
		}
		switch r := rl[i]; {
		case r == "#":
			return false // req reads deeper levels than f allows
		case fl == "+":
		case r == "+":
			return false // req reads every value of a level f fixes
		default:
			want, ok := fill(fl, user, cid)
			if !ok || want != r {
				return false
			}
		}
	}
	return len(rl) == len(f)
}
