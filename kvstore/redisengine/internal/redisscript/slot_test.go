package redisscript

import (
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

// TestSlot checks Slot against the slots Redis reports (CLUSTER KEYSLOT),
// hash tags included.
func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"foo":            12182,
		"somekey":        11058,
		"foo{hash_tag}":  2515,
		"{hash_tag}bar":  2515,
		"a":              15495,
		"b":              3300,
		"{}foo":          9500, // an empty tag: the whole key
		"x{}{hash_tag}":  14429,
		"{user1000}.fol": 3443,
		"":               0,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestMultiKeysOfAGroup(t *testing.T) {
	keys := MultiKeys(nil, "p:", "org-7", []kvstore.Update{{Key: "burst:u1"}, {Key: "a"}, {Key: "b"}})
	if want := "p:g{5:org-7}burst:u1"; keys[0] != want {
		t.Errorf("MultiKeys: %q, want %q", keys[0], want)
	}
	if Slot(keys[1]) != Slot(keys[2]) {
		t.Error("two keys of one group in different slots")
	}
}

// TestMultiKeysMatchOneByOne checks that MultiKeys builds, in one string,
// the keys that the ordinary and grouped forms build one by one.
func TestMultiKeysMatchOneByOne(t *testing.T) {
	updates := []kvstore.Update{{Key: "a"}, {Key: ""}, {Key: "client-42"}, {Key: "{x}"}}
	for _, group := range []string{"", "g", "org-1234567890", "{9:}"} {
		keys := MultiKeys(nil, "rk:", group, updates)
		keys2 := MultiKeys(make([]string, 1, 8), "rk:", group, updates)[1:]
		for i, u := range updates {
			want := "rk:{" + u.Key + "}"
			if group != "" {
				want = "rk:g" + kvstore.GroupKey(group, u.Key)
			}
			if keys[i] != want || keys2[i] != want {
				t.Errorf("group %q, key %q: %q and %q, want %q", group, u.Key, keys[i], keys2[i], want)
			}
		}
	}
}
