package broker

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

// aclRole is a compiled Role.
type aclRole struct {
	name     string
	pub, sub [][]string // filters split into levels
}

// acl decides what each client may publish to and subscribe to.
// Usernames and certificate names are separate namespaces: each has its
// own map to roles, and whoever is in neither is a device.
type acl struct {
	roles     map[string]*aclRole
	users     map[string]*aclRole // username → role
	certs     map[string]*aclRole // certificate name → role
	anonymous *aclRole
}

func newACL(roles map[string]Role, users, certs map[string]string, anonymous string) (*acl, error) {
	a := &acl{roles: map[string]*aclRole{}, users: map[string]*aclRole{}, certs: map[string]*aclRole{}}
	for name, r := range roles {
		ar := &aclRole{name: name}
		for _, f := range r.Publish {
			ar.pub = append(ar.pub, strings.Split(f, "/"))
		}
		for _, f := range r.Subscribe {
			ar.sub = append(ar.sub, strings.Split(f, "/"))
		}
		a.roles[name] = ar
	}
	for user, role := range users {
		r, ok := a.roles[role]
		if !ok {
			return nil, fmt.Errorf("mqtt.acl.users.%s: no role %q", user, role)
		}
		a.users[user] = r
	}
	for name, role := range certs {
		r, ok := a.roles[role]
		if !ok {
			return nil, fmt.Errorf("mqtt.acl.certificates.%s: no role %q", name, role)
		}
		a.certs[name] = r
	}
	var ok bool
	if a.anonymous, ok = a.roles[anonymous]; !ok {
		return nil, fmt.Errorf("mqtt.acl.anonymous_role: no role %q", anonymous)
	}
	if a.roles["device"] == nil {
		return nil, fmt.Errorf("mqtt.acl.roles: the device role is needed")
	}
	return a, nil
}

// userRole returns the role of a user of the users file.
func (a *acl) userRole(user string) *aclRole {
	if r, ok := a.users[user]; ok {
		return r
	}
	return a.roles["device"]
}

// certRole returns the role of a verified client certificate's name.
func (a *acl) certRole(name string) *aclRole {
	if r, ok := a.certs[name]; ok {
		return r
	}
	return a.roles["device"]
}

// canPublish reports whether a client with identity user and client id
// cid may publish to topic.
func (r *aclRole) canPublish(topic, user, cid string) bool {
	for _, f := range r.pub {
		if matchTopic(f, topic, user, cid) {
			return true
		}
	}
	return false
}

// canRead reports whether a message on topic may be delivered to the
// client: a subscribe filter of the role matches it.
func (r *aclRole) canRead(topic, user, cid string) bool {
	for _, f := range r.sub {
		if matchTopic(f, topic, user, cid) {
			return true
		}
	}
	return false
}

// canSubscribe reports whether the subscription filter req lies within one
// of the role's subscribe filters: every topic req matches, the allowed
// filter matches too.
func (r *aclRole) canSubscribe(req, user, cid string) bool {
	for _, f := range r.sub {
		if within(f, req, user, cid) {
			return true
		}
	}
	return false
}

// identityLevel reports whether s can stand for a placeholder: one whole
// level, no wildcard, not empty.
func identityLevel(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/+#")
}

// fill returns the literal an ACL level stands for, or level itself.
func fill(level, user, cid string) (string, bool) {
	switch level {
	case levelUsername:
		return user, identityLevel(user)
	case levelClientID:
		return cid, identityLevel(cid)
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
