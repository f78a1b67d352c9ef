package signedwindow

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// FuzzCompositeToken: the version 2 parser accepts exactly one encoding of
// each token (what it accepts re-encodes to the same bytes), never panics,
// and a composite accepts no text as a valid token unless it issued that
// text.
func FuzzCompositeToken(f *testing.F) {
	at := func() time.Time { return t0 }
	c, err := NewComposite(CompositeConfig{Policies: []ratekit.Policy{burstP, dailyP}, Keys: []Key{{ID: 3, Secret: secret(3)}}, Now: at})
	if err != nil {
		f.Fatal(err)
	}
	issued := map[string]bool{}
	state := ""
	for i := 0; i < 4; i++ {
		d, err := c.Allow(context.Background(), ratekit.Request{Key: "ip", Cost: 1, State: state})
		if err != nil {
			f.Fatal(err)
		}
		state = d.State
		issued[state] = true
		f.Add(state)
	}
	f.Add("")
	f.Add("AgMC")
	f.Fuzz(func(t *testing.T, s string) {
		var raw [maxCompositeRaw]byte
		var src [maxCompositeText]byte
		if n, ok := decodeStrict(raw[:], src[:], s, maxCompositeRaw); ok {
			kid, k, bodyLen, err := parseCompositeToken(raw[:n], nil)
			if err == nil {
				ws := make([]cwin, k)
				if _, _, _, err := parseCompositeToken(raw[:n], ws); err != nil {
					t.Fatalf("%q parses with any count but not with its own (%d): %v", s, k, err)
				}
				again := appendCompositeBody(nil, kid, ws)
				if !bytes.Equal(again, raw[:bodyLen]) {
					t.Fatalf("%q parses to %+v, which re-encodes to %x, not %x", s, ws, again, raw[:bodyLen])
				}
			}
		}
		d, err := c.Peek(context.Background(), ratekit.Request{Key: "ip", Cost: 1, State: s})
		if err != nil {
			t.Fatal(err)
		}
		if d.StateError == nil && !issued[s] {
			t.Fatalf("%q accepted but never issued", s)
		}
	})
}
