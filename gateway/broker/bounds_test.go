package broker

import "testing"

func TestRetainedAdmit(t *testing.T) {
	const c = 100 // a message's cost in these cases
	limits := RetainedLimits{Count: 3, Bytes: 3 * c, PerIdentity: 2, BytesPerIdentity: 2 * c}
	type held struct{ owner, topic string }
	for name, tc := range map[string]struct {
		held         []held
		owner, topic string
		cost         int64
		want         string // the bound passed; empty: admitted
	}{
		"first":                         {owner: "a", topic: "t1", cost: c},
		"identity's count":              {held: []held{{"a", "t1"}, {"a", "t2"}}, owner: "a", topic: "t3", cost: 1, want: "mqtt.max_retained_per_identity"},
		"identity's bytes":              {held: []held{{"a", "t1"}}, owner: "a", topic: "t2", cost: c + 1, want: "mqtt.max_retained_bytes_per_identity"},
		"replacing its own":             {held: []held{{"a", "t1"}, {"a", "t2"}}, owner: "a", topic: "t2", cost: c},
		"replacing another's":           {held: []held{{"a", "t1"}, {"a", "t2"}, {"b", "t3"}}, owner: "b", topic: "t1", cost: c},
		"total count":                   {held: []held{{"a", "t1"}, {"b", "t2"}, {"c", "t3"}}, owner: "d", topic: "t4", cost: 1, want: "mqtt.max_retained"},
		"total bytes":                   {held: []held{{"a", "t1"}, {"b", "t2"}}, owner: "c", topic: "t3", cost: c + 1, want: "mqtt.max_retained_bytes"},
		"room made by a deletion":       {held: []held{{"a", "t1"}, {"a", "t2"}, {"a", ""}}, owner: "a", topic: "t3", cost: c},
		"another's replacement no room": {held: []held{{"a", "t1"}, {"a", "t2"}, {"b", "t3"}}, owner: "a", topic: "t3", cost: c, want: "mqtt.max_retained_per_identity"},
	} {
		t.Run(name, func(t *testing.T) {
			r := retained{limits: limits}
			for i, h := range tc.held {
				if h.topic == "" { // a deletion of the one before
					r.set("", tc.held[i-1].topic, 0)
					continue
				}
				r.set(h.owner, h.topic, c)
			}
			if why, ok := r.admit(tc.owner, tc.topic, tc.cost); why != tc.want || ok != (tc.want == "") {
				t.Fatalf("admit: %q, %v; want %q", why, ok, tc.want)
			}
		})
	}
	r := retained{limits: limits}
	r.set("a", "t1", c)
	r.set("b", "t1", 2*c)
	r.set("", "t1", 0)
	if n, b := r.held(); n != 0 || b != 0 || len(r.shares) != 0 {
		t.Fatalf("after a replacement and a deletion: %d, %d bytes, shares %v", n, b, r.shares)
	}
}
