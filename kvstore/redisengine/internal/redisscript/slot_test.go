package redisscript

import (
	"strconv"
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
	keys := MultiKeys(nil, new(Text), "p:", "org-7", []kvstore.Update{{Key: "burst:u1"}, {Key: "a"}, {Key: "b"}})
	if want := "p:g{5:org-7}burst:u1"; keys[0] != want {
		t.Errorf("MultiKeys: %q, want %q", keys[0], want)
	}
	if Slot(keys[1]) != Slot(keys[2]) {
		t.Error("two keys of one group in different slots")
	}
}

// TestMultiKeysMatchOneByOne checks that MultiKeys builds, into one Text,
// the keys that the ordinary and grouped forms build one by one, and that
// the keys of one Text keep their bytes while it writes more.
func TestMultiKeysMatchOneByOne(t *testing.T) {
	updates := []kvstore.Update{{Key: "a"}, {Key: ""}, {Key: "client-42"}, {Key: "{x}"}}
	var text Text
	text.Reset(make([]byte, 4)) // grows while the keys are written
	var keys []string
	for _, group := range []string{"", "g", "org-1234567890", "{9:}"} {
		keys = MultiKeys(keys, &text, "rk:", group, updates)
	}
	for g, group := range []string{"", "g", "org-1234567890", "{9:}"} {
		for i, u := range updates {
			want := "rk:{" + u.Key + "}"
			if group != "" {
				want = "rk:g" + kvstore.GroupKey(group, u.Key)
			}
			if got := keys[g*len(updates)+i]; got != want {
				t.Errorf("group %q, key %q: %q, want %q", group, u.Key, got, want)
			}
		}
	}
}

// TestTextInt checks the numbers Text writes, beside strconv's.
func TestTextInt(t *testing.T) {
	var text Text
	vals := []int64{0, 7, 99, 100, -1, 1 << 52, -1 << 63, 1<<63 - 1}
	got := make([]string, len(vals))
	for i, v := range vals {
		got[i] = text.Int(v)
	}
	for i, v := range vals {
		if want := strconv.FormatInt(v, 10); got[i] != want {
			t.Errorf("Int(%d) = %q, want %q", v, got[i], want)
		}
	}
}
