package signedwindow

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ratekit/ratekit"
)

// benchLimiter returns a limiter whose limit is never reached, and a valid
// token for subject "203.0.113.7", so every Allow verifies, counts and signs.
func benchLimiter(b *testing.B, cacheSize int) (*Limiter, string) {
	b.Helper()
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.Quota = ratekit.MaxQuota
	cfg.ReplayCacheSize = cacheSize
	l := mustNew(b, cfg)
	d, err := l.Allow(context.Background(), ratekit.Request{Key: "203.0.113.7", Cost: 1})
	if err != nil {
		b.Fatal(err)
	}
	return l, d.State
}

// BenchmarkAllow measures a full decision: verify the incoming token, count,
// sign the new one.
func BenchmarkAllow(b *testing.B) {
	l, token := benchLimiter(b, 0)
	ctx := context.Background()
	req := ratekit.Request{Key: "203.0.113.7", Cost: 1, State: token}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				d, err := l.Allow(ctx, req)
				if err != nil || !d.Allowed || d.StateError != nil {
					b.Fatal(err, d.StateError)
				}
			}
		})
	})
	b.Run("serial-ipv6", func(b *testing.B) {
		// A 39-byte subject makes each MAC input two SHA-256 blocks.
		const ip6 = "2001:0db8:0000:0000:0000:ff00:0042:8329"
		d, err := l.Allow(ctx, ratekit.Request{Key: ip6, Cost: 1})
		if err != nil {
			b.Fatal(err)
		}
		req := ratekit.Request{Key: ip6, Cost: 1, State: d.State}
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				if d, err := l.Allow(ctx, req); err != nil || d.StateError != nil {
					b.Fatal(err, d.StateError)
				}
			}
		})
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d, err := l.Allow(ctx, req)
				if err != nil || !d.Allowed || d.StateError != nil {
					b.Fatal(err, d.StateError)
				}
			}
		})
	})
}

// BenchmarkAllowReplayCache measures Allow with a replay cache of 1024
// entries fed 4096 distinct tokens in turn, so entries are inserted,
// found and evicted.
func BenchmarkAllowReplayCache(b *testing.B) {
	l, _ := benchLimiter(b, 1024)
	ctx := context.Background()
	sc := l.keys.signing.get(purposeToken)
	start := t0.Unix()
	tokens := make([]string, 4096)
	for i := range tokens {
		tokens[i] = l.signToken(sc, start, int64(i), "203.0.113.7")
	}
	l.keys.signing.put(purposeToken, sc)
	run := func(b *testing.B, next func() int) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d, err := l.Allow(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1, State: tokens[next()%len(tokens)]})
				if err != nil || !d.Allowed {
					b.Fatal(err)
				}
			}
		})
	}
	var i atomic.Int64
	b.Run("parallel", func(b *testing.B) { run(b, func() int { return int(i.Add(1)) }) })
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		reportCPU(b, func() {
			for b.Loop() {
				n++
				if _, err := l.Allow(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1, State: tokens[n%len(tokens)]}); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkPeek measures a peek at a valid token (verification only).
func BenchmarkPeek(b *testing.B) {
	l, token := benchLimiter(b, 0)
	ctx := context.Background()
	req := ratekit.Request{Key: "203.0.113.7", Cost: 1, State: token}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Peek(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkVerifySolution measures the server's side of proof-of-work: one
// SHA-256 and one HMAC.
func BenchmarkVerifySolution(b *testing.B) {
	l, _ := benchLimiter(b, 0)
	ch, err := l.NewChallenge("203.0.113.7", 8)
	if err != nil {
		b.Fatal(err)
	}
	sol, err := Solve(context.Background(), ch.Value)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				if err := l.VerifySolution(sol, "203.0.113.7", 8); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := l.VerifySolution(sol, "203.0.113.7", 8); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkNewChallenge measures issuing a challenge (random salt, HMAC).
func BenchmarkNewChallenge(b *testing.B) {
	l, _ := benchLimiter(b, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.NewChallenge("203.0.113.7", 16); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyNonce measures nonce verification.
func BenchmarkVerifyNonce(b *testing.B) {
	l, _ := benchLimiter(b, 0)
	n, err := l.NewNonce("203.0.113.7")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.VerifyNonce(n, "203.0.113.7"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSolve measures the client's side at 12 bits, for scale.
func BenchmarkSolve(b *testing.B) {
	l, _ := benchLimiter(b, 0)
	chs := make([]string, 64)
	for i := range chs {
		ch, err := l.NewChallenge("203.0.113.7", 12)
		if err != nil {
			b.Fatal(err)
		}
		chs[i] = ch.Value
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := Solve(context.Background(), chs[i%len(chs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkHMACSHA256 is the reference for the figures above: one
// HMAC-SHA256 of a one-block message with a reused hash.Hash, the floor of
// a verification. A full decision costs about two of these plus encoding.
func BenchmarkHMACSHA256(b *testing.B) {
	l, _ := benchLimiter(b, 0)
	sc := l.keys.signing.get(purposeToken)
	body := []byte{1, 1, 0x80, 0xd7, 0xf6, 0xd8, 0x06, 0x01, 0x3c}
	var mac [macLen]byte
	b.ReportAllocs()
	reportCPU(b, func() {
		for b.Loop() {
			sc.mac(&mac, body, l.name, "203.0.113.7")
		}
	})
}
