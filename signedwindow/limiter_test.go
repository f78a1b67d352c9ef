package signedwindow

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

const (
	alice = "203.0.113.7"
	bob   = "198.51.100.1"
)

// allow calls l.Allow for subject with state and cost 1, failing on error.
func allow(t *testing.T, l *Limiter, subject, state string) ratekit.Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), ratekit.Request{Key: subject, Cost: 1, State: state})
	if err != nil {
		t.Fatalf("Allow: %v", err)
	}
	return d
}

// tokenAt returns a token for subject signed by l for the window starting
// at start (Unix seconds) with count units used.
func tokenAt(l *Limiter, start, count int64, subject string) string {
	sc := l.keys.signing.get(purposeToken)
	defer l.keys.signing.put(purposeToken, sc)
	return l.signToken(sc, start, count, subject)
}

// craft signs an arbitrary body with l's signing key for subject and
// returns the text of body || MAC || extra. It lets tests build values that
// carry a valid MAC but break the format.
func craft(l *Limiter, p purpose, body []byte, subject string, extra ...byte) string {
	sc := l.keys.signing.get(p)
	defer l.keys.signing.put(p, sc)
	var mac [macLen]byte
	sc.mac(&mac, body, l.name, subject)
	raw := append(append(append([]byte{}, body...), mac[:]...), extra...)
	return b64.EncodeToString(raw)
}

// tokenBody builds a token body with the given fields; count is encoded by
// countBytes when non-nil.
func tokenBody(ver, kid byte, start int64, count []byte, ttl int64) []byte {
	b := []byte{ver, kid}
	b = binary.AppendUvarint(b, uint64(start))
	b = append(b, count...)
	return binary.AppendUvarint(b, uint64(ttl))
}

func decodeToken(t *testing.T, s string) []byte {
	t.Helper()
	raw, err := b64.DecodeString(s)
	if err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return raw
}

func TestAllowCountsWindow(t *testing.T) {
	clock := newClock(t0)
	l := mustNew(t, testConfig(clock))
	windowEnd := time.Unix(t0.Unix(), 0).Add(time.Minute) // window starts at the whole second

	state := ""
	for i := int64(1); i <= 3; i++ {
		d := allow(t, l, alice, state)
		if !d.Allowed || d.Remaining != 3-i || d.RetryAfter != 0 {
			t.Fatalf("request %d: Allowed=%v Remaining=%d RetryAfter=%v; want true, %d, 0", i, d.Allowed, d.Remaining, d.RetryAfter, 3-i)
		}
		if want := windowEnd.Sub(clock.Now()); d.ResetAfter != want {
			t.Fatalf("request %d: ResetAfter = %v, want %v", i, d.ResetAfter, want)
		}
		if i == 1 && !errors.Is(d.StateError, ErrTokenMissing) {
			t.Fatalf("first request: StateError = %v, want ErrTokenMissing", d.StateError)
		}
		if i > 1 && d.StateError != nil {
			t.Fatalf("request %d: StateError = %v, want nil", i, d.StateError)
		}
		if d.Quota != 3 || d.Policy != (ratekit.Policy{Name: "contact-form", Quota: 3, Window: time.Minute, Algorithm: ratekit.FixedWindow}) {
			t.Fatalf("Quota=%d Policy=%+v", d.Quota, d.Policy)
		}
		tok, err := l.VerifyToken(d.State, alice)
		if err != nil || tok.Count != i || !tok.WindowStart.Equal(time.Unix(t0.Unix(), 0)) || !tok.Expires.Equal(windowEnd) {
			t.Fatalf("request %d: token %+v, %v", i, tok, err)
		}
		state = d.State
		clock.Add(10 * time.Second)
	}

	// The fourth request is denied, takes nothing and hands back the token.
	d := allow(t, l, alice, state)
	if d.Allowed || d.Remaining != 0 || d.State != state || d.StateError != nil {
		t.Fatalf("denied: %+v", d)
	}
	if want := windowEnd.Sub(clock.Now()); d.RetryAfter != want || d.ResetAfter != want {
		t.Fatalf("denied: RetryAfter=%v ResetAfter=%v, want %v", d.RetryAfter, d.ResetAfter, want)
	}

	// One nanosecond before the window ends it is still denied; at the end
	// the token is from a past window and a fresh count starts.
	clock.Add(windowEnd.Sub(clock.Now()) - 1)
	if d := allow(t, l, alice, state); d.Allowed || d.RetryAfter != 1 {
		t.Fatalf("just before the end: Allowed=%v RetryAfter=%v", d.Allowed, d.RetryAfter)
	}
	clock.Add(1)
	d = allow(t, l, alice, state)
	if !d.Allowed || d.Remaining != 2 || !errors.Is(d.StateError, ErrTokenStaleWindow) {
		t.Fatalf("after the window: %+v", d)
	}
	if tok, err := l.VerifyToken(d.State, alice); err != nil || !tok.WindowStart.Equal(windowEnd) || tok.Count != 1 {
		t.Fatalf("new window token %+v, %v", tok, err)
	}
}

// TestIdempotencyKeyIgnored documents that a retried request with the same
// IdempotencyKey counts again: the strategy keeps no record of requests.
func TestIdempotencyKeyIgnored(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	req := ratekit.Request{Key: alice, Cost: 1, IdempotencyKey: "retry-1"}
	d, err := l.Allow(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	req.State = d.State
	if d, err = l.Allow(context.Background(), req); err != nil || d.Remaining != 1 {
		t.Fatalf("retry: %+v, %v; want counted again", d, err)
	}
}

func TestAllowCost(t *testing.T) {
	clock := newClock(t0)
	l := mustNew(t, testConfig(clock))
	ctx := context.Background()
	steps := []struct {
		cost      int64
		allowed   bool
		remaining int64
	}{
		{2, true, 1},
		{2, false, 1},
		{1, true, 0},
		{1, false, 0},
	}
	state := ""
	for i, s := range steps {
		d, err := l.Allow(ctx, ratekit.Request{Key: alice, Cost: s.cost, State: state})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != s.allowed || d.Remaining != s.remaining {
			t.Fatalf("step %d (cost %d): Allowed=%v Remaining=%d, want %v %d", i, s.cost, d.Allowed, d.Remaining, s.allowed, s.remaining)
		}
		state = d.State
	}
}

func TestRequestErrors(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		req  ratekit.Request
		want []error
	}{
		{"empty key", context.Background(), ratekit.Request{Cost: 1}, []error{ratekit.ErrEmptyKey, ratekit.ErrInvalidRequest}},
		{"long key", context.Background(), ratekit.Request{Key: strings.Repeat("k", ratekit.MaxKeyLen+1), Cost: 1}, []error{ratekit.ErrKeyTooLong}},
		{"zero cost", context.Background(), ratekit.Request{Key: alice}, []error{ratekit.ErrInvalidCost}},
		{"negative cost", context.Background(), ratekit.Request{Key: alice, Cost: -1}, []error{ratekit.ErrInvalidCost}},
		{"cost above limit", context.Background(), ratekit.Request{Key: alice, Cost: 4}, []error{ratekit.ErrCostExceedsQuota, ratekit.ErrInvalidRequest}},
		{"canceled", canceled, ratekit.Request{Key: alice, Cost: 1}, []error{context.Canceled}},
	}
	for _, tt := range tests {
		for name, call := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){
			"Allow": l.Allow, "Peek": l.Peek, "Refund": l.Refund,
		} {
			_, err := call(tt.ctx, tt.req)
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("%s %s: err = %v, want errors.Is %v", name, tt.name, err, w)
				}
			}
		}
	}

	before := mustNew(t, testConfig(newClock(time.Unix(-10, 0))))
	if _, err := before.Allow(context.Background(), ratekit.Request{Key: alice, Cost: 1}); err == nil {
		t.Error("Allow with a clock before 1970: no error")
	}
}

// TestRejectedTokens checks every reason a token is not used: each starts a
// fresh count and says why in StateError.
func TestRejectedTokens(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	l := mustNew(t, cfg)
	now := t0.Unix()
	valid := tokenAt(l, now, 2, alice)
	validRaw := decodeToken(t, valid)

	other := func(mod func(*Config)) *Limiter {
		c := testConfig(clock)
		mod(&c)
		return mustNew(t, c)
	}
	flip := func(i int) string {
		raw := append([]byte{}, validRaw...)
		raw[i] ^= 0x01
		return b64.EncodeToString(raw)
	}
	// A last character with non-zero unused bits: 26 bytes leave 4.
	nonCanonical := func() string {
		raw := append(append([]byte{}, validRaw...), 0)[:len(validRaw)]
		s := b64.EncodeToString(raw)
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		last := strings.IndexByte(alphabet, s[len(s)-1])
		return s[:len(s)-1] + string(alphabet[last|1])
	}
	nonce, err := l.NewNonce(alice)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		state string
		want  error
	}{
		{"missing", "", ErrTokenMissing},
		{"garbage", "not a token!", ErrTokenMalformed},
		{"standard alphabet", "+" + valid[1:], ErrTokenMalformed},
		{"padding", valid + "=", ErrTokenMalformed},
		{"line break", valid[:10] + "\n" + valid[10:], ErrTokenMalformed},
		{"carriage return", valid[:10] + "\r" + valid[10:], ErrTokenMalformed},
		{"non-zero trailing bits", nonCanonical(), ErrTokenMalformed},
		{"truncated", valid[:len(valid)-2], ErrTokenMalformed},
		{"too long", strings.Repeat("A", 300), ErrTokenMalformed},
		{"trailing byte after valid MAC", craft(l, purposeToken, tokenBody(tokenV1, 1, now, []byte{2}, 60), alice, 0), ErrTokenMalformed},
		{"non-minimal count with valid MAC", craft(l, purposeToken, tokenBody(tokenV1, 1, now, []byte{0x82, 0x00}, 60), alice), ErrTokenMalformed},
		{"start beyond format limit with valid MAC", craft(l, purposeToken, tokenBody(tokenV1, 1, maxUnixSeconds+1, []byte{0}, 60), alice), ErrTokenMalformed},
		{"unknown version with valid MAC", craft(l, purposeToken, tokenBody(0x02, 1, now, []byte{2}, 60), alice), ErrTokenUnknownVersion},
		{"nonce as token", nonce, ErrTokenUnknownVersion},
		{"tampered MAC", flip(len(validRaw) - 1), ErrTokenInvalid},
		{"tampered count", flip(len(validRaw) - macLen - 2), ErrTokenInvalid},
		{"wrong subject", tokenAt(l, now, 2, bob), ErrTokenInvalid},
		{"other policy", tokenAt(other(func(c *Config) { c.Name = "newsletter" }), now, 2, alice), ErrTokenInvalid},
		{"other secret, same key ID", tokenAt(other(func(c *Config) { c.Keys = []Key{{ID: 1, Secret: secret(2)}} }), now, 2, alice), ErrTokenInvalid},
		{"unknown key ID", tokenAt(other(func(c *Config) { c.Keys = []Key{{ID: 9, Secret: secret(1)}} }), now, 2, alice), ErrTokenUnknownKey},
		{"previous window", tokenAt(l, now-60, 2, alice), ErrTokenStaleWindow},
		{"long past window", tokenAt(l, now-86400, 2, alice), ErrTokenStaleWindow},
		// Issued when the window was 30 s: expired although a 60 s window
		// starting then would still run.
		{"expired", tokenAt(other(func(c *Config) { c.Window = 30 * time.Second }), now-40, 2, alice), ErrTokenExpired},
		{"future beyond MaxSkew", tokenAt(l, now+6, 2, alice), ErrTokenFuture},
		{"far future", tokenAt(l, maxUnixSeconds, 2, alice), ErrTokenFuture},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := allow(t, l, alice, tt.state)
			if !errors.Is(d.StateError, tt.want) {
				t.Fatalf("StateError = %v, want %v", d.StateError, tt.want)
			}
			if !d.Allowed || d.Remaining != 2 {
				t.Fatalf("fresh count: Allowed=%v Remaining=%d, want true 2", d.Allowed, d.Remaining)
			}
			tok, err := l.VerifyToken(d.State, alice)
			if err != nil || tok.Count != 1 || tok.WindowStart.Unix() != now {
				t.Fatalf("new token %+v, %v; want count 1 from now", tok, err)
			}
			if _, err := l.VerifyToken(tt.state, alice); !errors.Is(err, tt.want) {
				t.Fatalf("VerifyToken: %v, want %v", err, tt.want)
			}
		})
	}

	// The valid token itself is accepted, as a control.
	if d := allow(t, l, alice, valid); d.StateError != nil || d.Remaining != 0 {
		t.Fatalf("valid token: %+v", d)
	}
}

// TestClockSkew checks that a window starting a little in the future (an
// instance with a fast clock issued it) is honoured and counted in that
// window, up to MaxSkew, and that MaxSkew < 0 tolerates nothing.
func TestClockSkew(t *testing.T) {
	clock := newClock(t0)
	fast := newClock(t0.Add(3 * time.Second))
	lFast := mustNew(t, testConfig(fast))
	l := mustNew(t, testConfig(clock))

	d := allow(t, lFast, alice, "")
	d = allow(t, l, alice, d.State)
	if d.StateError != nil || d.Remaining != 1 {
		t.Fatalf("skewed token: %+v", d)
	}
	start := time.Unix(t0.Unix()+3, 0)
	if want := start.Add(time.Minute).Sub(t0); d.ResetAfter != want {
		t.Fatalf("ResetAfter = %v, want %v (the skewed window's end)", d.ResetAfter, want)
	}

	// Exactly at the bound: the window starts MaxSkew from now.
	clock2 := newClock(time.Unix(t0.Unix(), 0))
	cfg := testConfig(clock2)
	cfg.MaxSkew = 2 * time.Second
	l2 := mustNew(t, cfg)
	if d := allow(t, l2, alice, tokenAt(l2, t0.Unix()+2, 1, alice)); d.StateError != nil {
		t.Fatalf("at MaxSkew: %v", d.StateError)
	}
	if d := allow(t, l2, alice, tokenAt(l2, t0.Unix()+3, 1, alice)); !errors.Is(d.StateError, ErrTokenFuture) {
		t.Fatalf("beyond MaxSkew: %v", d.StateError)
	}

	cfg.MaxSkew = -1
	strict := mustNew(t, cfg)
	if d := allow(t, strict, alice, tokenAt(strict, t0.Unix()+1, 1, alice)); !errors.Is(d.StateError, ErrTokenFuture) {
		t.Fatalf("negative MaxSkew: %v", d.StateError)
	}
	if d := allow(t, strict, alice, tokenAt(strict, t0.Unix(), 1, alice)); d.StateError != nil {
		t.Fatalf("negative MaxSkew, current window: %v", d.StateError)
	}
}

func TestPeek(t *testing.T) {
	clock := newClock(t0)
	l := mustNew(t, testConfig(clock))
	ctx := context.Background()

	// No token: a fresh window's token, nothing taken.
	d, err := l.Peek(ctx, ratekit.Request{Key: alice, Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 3 || !errors.Is(d.StateError, ErrTokenMissing) {
		t.Fatalf("Peek without token: %+v, %v", d, err)
	}
	if tok, err := l.VerifyToken(d.State, alice); err != nil || tok.Count != 0 {
		t.Fatalf("Peek token %+v, %v", tok, err)
	}

	state := allow(t, l, alice, allow(t, l, alice, d.State).State).State
	for range 3 { // peeking repeatedly takes nothing
		d, err = l.Peek(ctx, ratekit.Request{Key: alice, Cost: 1, State: state})
		if err != nil || !d.Allowed || d.Remaining != 1 || d.State != state || d.RetryAfter != 0 {
			t.Fatalf("Peek: %+v, %v", d, err)
		}
	}
	d, err = l.Peek(ctx, ratekit.Request{Key: alice, Cost: 2, State: state})
	if err != nil || d.Allowed || d.Remaining != 1 || d.RetryAfter != d.ResetAfter || d.RetryAfter <= 0 {
		t.Fatalf("Peek cost 2: %+v, %v", d, err)
	}
	if d := allow(t, l, alice, state); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Allow after peeks: %+v", d)
	}
}

func TestRefund(t *testing.T) {
	clock := newClock(t0)
	l := mustNew(t, testConfig(clock))
	ctx := context.Background()
	state := ""
	for range 3 {
		state = allow(t, l, alice, state).State
	}
	if allow(t, l, alice, state).Allowed {
		t.Fatal("fourth request allowed")
	}
	d, err := l.Refund(ctx, ratekit.Request{Key: alice, Cost: 2, State: state})
	if err != nil || !d.Allowed || d.Remaining != 2 || d.StateError != nil || d.RetryAfter != 0 {
		t.Fatalf("Refund: %+v, %v", d, err)
	}
	tok, err := l.VerifyToken(d.State, alice)
	if err != nil || tok.Count != 1 || tok.WindowStart.Unix() != t0.Unix() {
		t.Fatalf("refunded token %+v, %v", tok, err)
	}
	// Refunds never go below zero.
	d, err = l.Refund(ctx, ratekit.Request{Key: alice, Cost: 3, State: d.State})
	if err != nil || d.Remaining != 3 {
		t.Fatalf("Refund below zero: %+v, %v", d, err)
	}
	// A refund on a bad token gives back nothing and says why.
	d, err = l.Refund(ctx, ratekit.Request{Key: alice, Cost: 1, State: "junk"})
	if err != nil || d.Remaining != 3 || !errors.Is(d.StateError, ErrTokenMalformed) {
		t.Fatalf("Refund on junk: %+v, %v", d, err)
	}
}

func TestKeyRotation(t *testing.T) {
	clock := newClock(t0)
	k1 := Key{ID: 1, Secret: secret(1)}
	k2 := Key{ID: 2, Secret: secret(2)}
	with := func(keys ...Key) *Limiter {
		cfg := testConfig(clock)
		cfg.Keys = keys
		return mustNew(t, cfg)
	}
	before, during, after := with(k1), with(k2, k1), with(k2)

	old := allow(t, before, alice, "").State
	d := allow(t, during, alice, old)
	if d.StateError != nil || d.Remaining != 1 {
		t.Fatalf("old key during rotation: %+v", d)
	}
	tok, err := during.VerifyToken(d.State, alice)
	if err != nil || tok.KeyID != 2 {
		t.Fatalf("new token signed by key %d, %v; want 2", tok.KeyID, err)
	}
	if d := allow(t, after, alice, d.State); d.StateError != nil || d.Remaining != 0 {
		t.Fatalf("new key after rotation: %+v", d)
	}
	if d := allow(t, after, alice, old); !errors.Is(d.StateError, ErrTokenUnknownKey) {
		t.Fatalf("removed key: %v", d.StateError)
	}
	if d := allow(t, before, alice, tok.String()); !errors.Is(d.StateError, ErrTokenUnknownKey) {
		t.Fatalf("instance not yet rotated: %v", d.StateError)
	}

	// A denial on an old-key token hands back a token re-signed with the
	// new key, so the count survives the old key's removal.
	full := tokenAt(before, t0.Unix(), 3, alice)
	d = allow(t, during, alice, full)
	if d.Allowed || d.State == full {
		t.Fatalf("denied old-key token: %+v", d)
	}
	if tok, err := after.VerifyToken(d.State, alice); err != nil || tok.Count != 3 || tok.KeyID != 2 {
		t.Fatalf("re-signed denial token %+v, %v", tok, err)
	}

	// Nonces and challenges rotate the same way.
	n, err := before.NewNonce(alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := during.VerifyNonce(n, alice); err != nil {
		t.Fatalf("old nonce during rotation: %v", err)
	}
	if err := after.VerifyNonce(n, alice); !errors.Is(err, ErrTokenUnknownKey) {
		t.Fatalf("old nonce after rotation: %v", err)
	}
}

func TestNewConfig(t *testing.T) {
	clock := newClock(t0)
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"empty name", func(c *Config) { c.Name = "" }},
		{"bad name", func(c *Config) { c.Name = "contact form" }},
		{"zero limit", func(c *Config) { c.Quota = 0 }},
		{"zero window", func(c *Config) { c.Window = 0 }},
		{"sub-second window", func(c *Config) { c.Window = 500 * time.Millisecond }},
		{"fractional window", func(c *Config) { c.Window = 1500 * time.Millisecond }},
		{"window too long", func(c *Config) { c.Window = MaxWindow + time.Second }},
		{"no keys", func(c *Config) { c.Keys = nil }},
		{"short secret", func(c *Config) { c.Keys = []Key{{ID: 1, Secret: make([]byte, MinSecretLen-1)}} }},
		{"empty secret", func(c *Config) { c.Keys = []Key{{ID: 1}} }},
		{"short old secret", func(c *Config) { c.Keys = append(c.Keys, Key{ID: 2, Secret: []byte("short")}) }},
		{"duplicate key ID", func(c *Config) { c.Keys = append(c.Keys, Key{ID: 1, Secret: secret(2)}) }},
		{"negative replay cache", func(c *Config) { c.ReplayCacheSize = -1 }},
		{"negative nonce lifetime", func(c *Config) { c.NonceLifetime = -time.Second }},
		{"tiny challenge lifetime", func(c *Config) { c.ChallengeLifetime = time.Microsecond }},
		{"difficulty max too high", func(c *Config) { c.Difficulty = &DifficultyPolicy{Base: 1, Max: MaxDifficulty + 1} }},
		{"difficulty base above max", func(c *Config) { c.Difficulty = &DifficultyPolicy{Base: 10, Max: 8} }},
		{"difficulty negative step", func(c *Config) { c.Difficulty = &DifficultyPolicy{Base: 1, Step: -1, Max: 8} }},
		{"difficulty negative free", func(c *Config) { c.Difficulty = &DifficultyPolicy{Base: 1, Free: -1, Max: 8} }},
	}
	for _, tt := range tests {
		cfg := testConfig(clock)
		tt.mod(&cfg)
		l, err := New(cfg)
		if !errors.Is(err, ratekit.ErrInvalidConfig) || l != nil {
			t.Errorf("%s: New = %v, %v; want ErrInvalidConfig", tt.name, l, err)
		}
	}

	l, err := New(Config{Name: "api", Quota: 1, Window: time.Second, Keys: []Key{{ID: 0, Secret: secret(7)}}})
	if err != nil {
		t.Fatal(err)
	}
	if l.maxSkew != DefaultMaxSkew || l.nonceTTL != DefaultNonceLifetime || l.chalTTL != DefaultChallengeLifetime || l.diff != DefaultDifficulty || l.replay != nil {
		t.Fatalf("defaults not applied: %+v", l)
	}
	if p := l.Policy(); p != (ratekit.Policy{Name: "api", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}) {
		t.Fatalf("Policy() = %+v", p)
	}
	// The caller's secret is not kept: changing it later changes nothing.
	sec := secret(3)
	cfg := testConfig(clock)
	cfg.Keys = []Key{{ID: 1, Secret: sec}}
	l = mustNew(t, cfg)
	tok := allow(t, l, alice, "").State
	sec[0] ^= 0xff
	if d := allow(t, l, alice, tok); d.StateError != nil {
		t.Fatalf("after the caller changed its secret slice: %v", d.StateError)
	}
}

func TestParseTokenRoundTrip(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	for _, count := range []int64{0, 1, 127, 128, 1 << 40, 1<<63 - 1} {
		s := tokenAt(l, t0.Unix(), count, alice)
		tok, err := ParseToken(s)
		if err != nil {
			t.Fatalf("count %d: %v", count, err)
		}
		if tok.Count != count || tok.KeyID != 1 || tok.WindowStart.Unix() != t0.Unix() || tok.Expires.Sub(tok.WindowStart) != time.Minute {
			t.Fatalf("count %d: parsed %+v", count, tok)
		}
		if got := tok.String(); got != s {
			t.Fatalf("count %d: String() = %q, want %q", count, got, s)
		}
	}
	if _, err := l.VerifyToken(tokenAt(l, t0.Unix(), 0, alice), ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Fatalf("VerifyToken with empty subject: %v", err)
	}
	if _, err := ParseToken(""); !errors.Is(err, ErrTokenMissing) {
		t.Fatalf("empty: %v", err)
	}
}
