package auth

import (
	"strings"
	"testing"
)

func TestMatchTopic(t *testing.T) {
	for _, tc := range []struct {
		filter, topic string
		want          bool
	}{
		{"sensors/{username}/+", "sensors/dev-1/temp", true},
		{"sensors/{username}/+", "sensors/dev-2/temp", false},
		{"sensors/{username}/+", "sensors/dev-1", false},
		{"sensors/{username}/+", "sensors/dev-1/temp/x", false},
		{"sensors/{username}/+", "sensors/dev-1/", true}, // an empty level
		{"sensors/{username}", "sensors/dev-1", true},
		{"sensors/{username}", "sensors/dev-1/", false},
		{"sensors/{clientid}/#", "sensors/c-1/a/b", true},
		{"sensors/{clientid}/#", "sensors/c-1", true}, // # matches the parent level
		{"sensors/{clientid}/#", "sensors/dev-1/a", false},
		{"#", "anything/at/all", true},
		{"#", "$SYS/broker", false},
		{"+/x", "$SYS/x", false},
		{"#", "$app/x", true}, // '$' topics other than $SYS are covered
		{"+/x", "$app/x", true},
		{"#", "$sys/x", false}, // as mochi tells $SYS: case-insensitively
		{"$SYS/#", "$SYS/broker/load", true},
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/b", "a", false},
	} {
		if got := matchTopic(strings.Split(tc.filter, "/"), tc.topic, "dev-1", "c-1"); got != tc.want {
			t.Errorf("matchTopic(%q, %q) = %v, want %v", tc.filter, tc.topic, got, tc.want)
		}
	}
	// An identity that is not one topic level never fills a placeholder.
	for _, bad := range []string{"", "a/b", "+", "#", "x+"} {
		if matchTopic([]string{"s", levelUsername}, "s/"+bad, bad, "c") {
			t.Errorf("identity %q matched", bad)
		}
	}
	if n := testing.AllocsPerRun(100, func() { matchTopic([]string{"sensors", levelUsername, "+"}, "sensors/dev-1/temp", "dev-1", "c") }); n != 0 {
		t.Errorf("matchTopic allocates %v times", n)
	}
}

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		allowed, req string
		want         bool
	}{
		{"sensors/+/+", "sensors/+/+", true},
		{"sensors/+/+", "sensors/dev-1/temp", true},
		{"sensors/+/+", "sensors/#", false},
		{"sensors/+/+", "sensors/+", false},
		{"sensors/+/+", "#", false},
		{"sensors/#", "sensors/a/b/c", true},
		{"sensors/#", "sensors/#", true},
		{"sensors/#", "sensors", true},
		{"commands/{username}/#", "commands/dev-1/#", true},
		{"commands/{username}/#", "commands/dev-1/reboot", true},
		{"commands/{username}/#", "commands/+/#", false},
		{"commands/{username}/#", "commands/dev-2/#", false},
		{"#", "#", true},
		{"#", "$SYS/#", false},
		{"#", "$app/#", true},
		{"+/#", "$app/#", true},
		{"$SYS/#", "$SYS/#", true},
		{"$SYS/#", "#", false},
		{"sensors/+/+", "$share/g/sensors/+/+", true},
		{"sensors/+/+", "$share/g/#", false},
	} {
		if got := within(strings.Split(tc.allowed, "/"), tc.req, "dev-1", "c-1"); got != tc.want {
			t.Errorf("within(%q, %q) = %v, want %v", tc.allowed, tc.req, got, tc.want)
		}
	}
}

// TestDeny: deny filters win over allowing ones. A subscription within a
// denied filter is refused; one reaching into it is granted, and the
// messages on denied topics are not read on it.
func TestDeny(t *testing.T) {
	a, err := NewACL(map[string]Filters{
		"device": {Publish: []string{"sensors/{username}/+"}},
		"dash": {Publish: []string{"#"}, Subscribe: []string{"#"}, DenyPublish: []string{"sensors/+/config"},
			DenySubscribe: []string{"secret/#", "users/{username}/private"}},
	}, map[string]string{"ann": "dash"}, map[string]string{"cam": "dash"}, "device")
	if err != nil {
		t.Fatal(err)
	}
	r := a.Roles["dash"]
	for name, tc := range map[string]struct {
		got, want bool
	}{
		"subscribe #":                     {r.CanSubscribe("#", "ann", "c"), true},
		"subscribe +/x":                   {r.CanSubscribe("+/x", "ann", "c"), true},
		"subscribe secret/#":              {r.CanSubscribe("secret/#", "ann", "c"), false},
		"subscribe secret":                {r.CanSubscribe("secret", "ann", "c"), false},
		"subscribe secret/+/x":            {r.CanSubscribe("secret/+/x", "ann", "c"), false},
		"subscribe shared secret/#":       {r.CanSubscribe("$share/g/secret/#", "ann", "c"), false},
		"subscribe secrets/#":             {r.CanSubscribe("secrets/#", "ann", "c"), true},
		"subscribe own private":           {r.CanSubscribe("users/ann/private", "ann", "c"), false},
		"subscribe another's private":     {r.CanSubscribe("users/bob/private", "ann", "c"), true},
		"read public/x":                   {r.CanRead("public/x", "ann", "c"), true},
		"read secret/x":                   {r.CanRead("secret/x", "ann", "c"), false},
		"read secret":                     {r.CanRead("secret", "ann", "c"), false},
		"read own private":                {r.CanRead("users/ann/private", "ann", "c"), false},
		"publish secret/x":                {r.CanPublish("secret/x", "ann", "c"), true},
		"publish sensors/d/config":        {r.CanPublish("sensors/d/config", "ann", "c"), false},
		"publish sensors/d/temp":          {r.CanPublish("sensors/d/temp", "ann", "c"), true},
		"away user, secret/x":             {a.DeniedAway("secret/x", "ann", "c"), true},
		"away certificate, secret/x":      {a.DeniedAway("secret/x", "cam", "c"), true},
		"away device, secret/x":           {a.DeniedAway("secret/x", "dev-1", "c"), false},
		"away anonymous device, secret/x": {a.DeniedAway("secret/x", "", "c"), false},
		"away user, public/x":             {a.DeniedAway("public/x", "ann", "c"), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", name, tc.got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { r.CanRead("sensors/dev-1/temp", "ann", "c") }); n != 0 {
		t.Errorf("CanRead allocates %v times", n)
	}
}
