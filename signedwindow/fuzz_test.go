package signedwindow

import (
	"context"
	mathrand "math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// Fuzz tests check two properties of every parser:
//
//   - whatever is accepted re-encodes to the identical text (each value has
//     exactly one accepted encoding), and
//   - nothing is accepted as verified unless this limiter issued exactly
//     that text (no unsigned or forged value passes).
//
// The limiters run on a fixed clock so that the issued values stay valid.

// fuzzLimiters returns a limiter with two keys (8 signs, 7 still verifies)
// on a fixed clock, and one with key 7 only, to issue old-key values. Their
// random bytes are deterministic.
func fuzzLimiters(f testing.TB) (l, old *Limiter) {
	f.Helper()
	at := func() time.Time { return t0 }
	cfg := Config{Name: "contact-form", Quota: 5, Window: time.Minute, Now: at,
		Keys: []Key{{ID: 8, Secret: secret(8)}, {ID: 7, Secret: secret(7)}}}
	l = mustNew(f, cfg)
	cfg.Keys = cfg.Keys[1:]
	old = mustNew(f, cfg)
	// Every fuzz worker process must issue the same nonces and challenges.
	for i, lim := range []*Limiter{l, old} {
		lim.random = mathrand.NewChaCha8([32]byte{byte(i)}).Read
	}
	return l, old
}

func FuzzToken(f *testing.F) {
	l, old := fuzzLimiters(f)
	issued := map[string]bool{}
	for _, lim := range []*Limiter{l, old} {
		for _, count := range []int64{0, 1, 4, 300} {
			s := tokenAt(lim, t0.Unix(), count, alice)
			issued[s] = true
			f.Add(s)
		}
	}
	f.Add("")
	f.Add("AQE")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err == nil {
			if got := tok.String(); got != s {
				t.Fatalf("ParseToken(%q).String() = %q", s, got)
			}
		}
		vt, verr := l.VerifyToken(s, alice)
		if verr == nil {
			if err != nil {
				t.Fatalf("VerifyToken accepted %q that ParseToken refused: %v", s, err)
			}
			if !issued[s] {
				t.Fatalf("VerifyToken accepted %q, which was never issued", s)
			}
			if vt.String() != s {
				t.Fatalf("verified token re-encodes to %q", vt.String())
			}
		}
	})
}

func FuzzNonce(f *testing.F) {
	l, old := fuzzLimiters(f)
	issued := map[string]bool{}
	for _, lim := range []*Limiter{l, old} {
		n, err := lim.NewNonce(alice)
		if err != nil {
			f.Fatal(err)
		}
		issued[n] = true
		f.Add(n)
	}
	f.Add("EQg")
	f.Fuzz(func(t *testing.T, s string) {
		var st stamp
		var raw [maxRawLen]byte
		var src [maxEncLen]byte
		if _, err := parseStamp(&st, raw[:], src[:], s, nonceV1, noncePayload); err == nil {
			if got := st.String(); got != s {
				t.Fatalf("nonce %q re-encodes to %q", s, got)
			}
		}
		if l.VerifyNonce(s, alice) == nil && !issued[s] {
			t.Fatalf("VerifyNonce accepted %q, which was never issued", s)
		}
	})
}

func FuzzChallenge(f *testing.F) {
	l, old := fuzzLimiters(f)
	issued := map[string]bool{}
	for _, lim := range []*Limiter{l, old} {
		for _, bits := range []int{0, 1, MaxDifficulty} {
			ch, err := lim.NewChallenge(alice, bits)
			if err != nil {
				f.Fatal(err)
			}
			issued[ch.Value] = true
			f.Add(ch.Value)
		}
	}
	f.Add("IQg")
	f.Fuzz(func(t *testing.T, s string) {
		var st stamp
		var raw [maxRawLen]byte
		var src [maxEncLen]byte
		if _, err := parseStamp(&st, raw[:], src[:], s, challengeV1, challengePayload); err == nil {
			if got := st.String(); got != s {
				t.Fatalf("challenge %q re-encodes to %q", s, got)
			}
			if st.payload[0] > MaxDifficulty {
				t.Fatalf("challenge %q accepted with difficulty %d", s, st.payload[0])
			}
		}
		if _, err := l.verifyStamp(purposeChallenge, challengeV1, challengePayload, s, alice, t0, l.chalTTL); err == nil && !issued[s] {
			t.Fatalf("challenge %q verified but was never issued", s)
		}
	})
}

func FuzzSolution(f *testing.F) {
	l, _ := fuzzLimiters(f)
	issued := map[string]bool{}
	for _, bits := range []int{0, 3} {
		ch, err := l.NewChallenge(alice, bits)
		if err != nil {
			f.Fatal(err)
		}
		issued[ch.Value] = true
		sol, err := Solve(context.Background(), ch.Value)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(sol)
		f.Add(ch.Value + ".007")
	}
	f.Add(".0")
	f.Fuzz(func(t *testing.T, s string) {
		challenge, counter, err := splitSolution(s)
		if err == nil {
			if got := challenge + "." + strconv.FormatUint(counter, 10); got != s {
				t.Fatalf("solution %q re-encodes to %q", s, got)
			}
			if counter > MaxCounter {
				t.Fatalf("solution %q accepted with counter %d", s, counter)
			}
		}
		if l.VerifySolution(s, alice, 0) == nil {
			if err != nil || !issued[challenge] {
				t.Fatalf("VerifySolution accepted %q for a challenge never issued", s)
			}
			var st stamp
			var raw [maxRawLen]byte
			var src [maxEncLen]byte
			if _, err := parseStamp(&st, raw[:], src[:], challenge, challengeV1, challengePayload); err != nil || !hasWork(s, int(st.payload[0])) {
				t.Fatalf("VerifySolution accepted %q without the work", s)
			}
		}
	})
}
