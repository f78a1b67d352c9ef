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

func TestMultiKey(t *testing.T) {
	if got, want := MultiKey("p:", "org-7", "burst:u1"), "p:g{5:org-7}burst:u1"; got != want {
		t.Errorf("MultiKey = %q, want %q", got, want)
	}
	if Slot(MultiKey("p:", "g", "a")) != Slot(MultiKey("p:", "g", "b")) {
		t.Error("two keys of one group in different slots")
	}
}

// TestMultiKeysMatchOneByOne checks that MultiKeys builds, in one string,
// the keys that the single-key forms build one by one.
func TestMultiKeysMatchOneByOne(t *testing.T) {
	updates := []kvstore.Update{{Key: "a"}, {Key: ""}, {Key: "client-42"}, {Key: "{x}"}}
	for _, group := range []string{"", "g", "org-1234567890", "{9:}"} {
		keys := MultiKeys(nil, "rk:", group, updates)
		keys2 := MultiKeys(make([]string, 1, 8), "rk:", group, updates)[1:]
		for i, u := range updates {
			want := "rk:{" + u.Key + "}"
			if group != "" {
				want = MultiKey("rk:", group, u.Key)
			}
			if keys[i] != want || keys2[i] != want {
				t.Errorf("group %q, key %q: %q and %q, want %q", group, u.Key, keys[i], keys2[i], want)
			}
		}
	}
}
