package signedwindow

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func TestNonce(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	l := mustNew(t, cfg)
	n, err := l.NewNonce(alice)
	if err != nil {
		t.Fatal(err)
	}
	if len(n) != 54 {
		t.Errorf("nonce is %d characters, want 54 (doc)", len(n))
	}
	n2, _ := l.NewNonce(alice)
	if n == n2 {
		t.Fatal("two nonces are equal")
	}
	if err := l.VerifyNonce(n, alice); err != nil {
		t.Fatalf("fresh nonce: %v", err)
	}
	if err := l.VerifyNonce(n, alice); err != nil {
		t.Fatalf("reused nonce without a replay cache: %v", err)
	}

	other := func(mod func(*Config)) *Limiter {
		c := testConfig(clock)
		mod(&c)
		return mustNew(t, c)
	}
	issue := func(l *Limiter, subject string) string {
		n, err := l.NewNonce(subject)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	token := allow(t, l, alice, "").State
	ch, err := l.NewChallenge(alice, 1)
	if err != nil {
		t.Fatal(err)
	}
	raw := decodeToken(t, n)
	raw[len(raw)-1] ^= 1
	tampered := b64.EncodeToString(raw)

	tests := []struct {
		name  string
		nonce string
		want  error
	}{
		{"empty", "", ErrTokenMissing},
		{"garbage", "!!!", ErrTokenMalformed},
		{"token as nonce", token, ErrTokenUnknownVersion},
		{"challenge as nonce", ch.Value, ErrTokenUnknownVersion},
		{"tampered", tampered, ErrTokenInvalid},
		{"wrong subject", issue(l, bob), ErrTokenInvalid},
		{"other policy", issue(other(func(c *Config) { c.Name = "other" }), alice), ErrTokenInvalid},
		{"unknown key", issue(other(func(c *Config) { c.Keys = []Key{{ID: 4, Secret: secret(4)}} }), alice), ErrTokenUnknownKey},
		{"from a fast clock", issue(other(func(c *Config) { c.Now = func() time.Time { return t0.Add(time.Minute) } }), alice), ErrTokenFuture},
		{"from a longer lifetime", issue(other(func(c *Config) { c.NonceLifetime = time.Hour }), alice), ErrTokenFuture},
		{"non-minimal expiry with valid MAC", craft(l, purposeNonce, append([]byte{nonceV1, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, make([]byte, noncePayload)...), alice), ErrTokenMalformed},
		{"short payload with valid MAC", craft(l, purposeNonce, []byte{nonceV1, 1, 0x7f, 1, 2, 3}, alice), ErrTokenMalformed},
		{"trailing byte with valid MAC", craft(l, purposeNonce, append([]byte{nonceV1, 1, 0x7f}, make([]byte, noncePayload)...), alice, 0), ErrTokenMalformed},
	}
	for _, tt := range tests {
		if err := l.VerifyNonce(tt.nonce, alice); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}

	// Expiry: valid until NonceLifetime has passed, to the millisecond.
	clock.Add(DefaultNonceLifetime - time.Millisecond)
	if err := l.VerifyNonce(n, alice); err != nil {
		t.Fatalf("just before expiry: %v", err)
	}
	clock.Add(time.Millisecond)
	if err := l.VerifyNonce(n, alice); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("at expiry: %v", err)
	}
	if _, err := l.NewNonce(""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Fatalf("NewNonce(\"\"): %v", err)
	}
	if err := l.VerifyNonce(n, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Fatalf("VerifyNonce with empty subject: %v", err)
	}
}

func TestNonceReplayCache(t *testing.T) {
	cfg := testConfig(newClock(t0))
	cfg.ReplayCacheSize = 16
	l := mustNew(t, cfg)
	n, _ := l.NewNonce(alice)
	if err := l.VerifyNonce(n, alice); err != nil {
		t.Fatal(err)
	}
	if err := l.VerifyNonce(n, alice); !errors.Is(err, ErrTokenReplayed) {
		t.Fatalf("second use: %v", err)
	}
}

func TestDifficultyPolicy(t *testing.T) {
	p := DifficultyPolicy{Base: 10, Free: 2, Step: 3, Max: 20}
	for used, want := range map[int64]int{-5: 10, 0: 10, 1: 10, 2: 13, 3: 16, 4: 19, 5: 20, 1 << 62: 20} {
		if got := p.Bits(used); got != want {
			t.Errorf("Bits(%d) = %d, want %d", used, got, want)
		}
	}
	if got := (DifficultyPolicy{Base: 5, Max: 9}).Bits(100); got != 5 {
		t.Errorf("no step: %d", got)
	}
	cfg := testConfig(newClock(t0))
	cfg.Difficulty = &DifficultyPolicy{}
	if got := mustNew(t, cfg).Difficulty(100); got != 0 {
		t.Errorf("no-work policy: Difficulty(100) = %d", got)
	}
	l := mustNew(t, testConfig(newClock(t0)))
	for used, want := range map[int64]int{0: 16, 1: 16, 2: 18, 3: 20, 4: 22, 5: 24, 6: 24} {
		if got := l.Difficulty(used); got != want {
			t.Errorf("default Difficulty(%d) = %d, want %d", used, got, want)
		}
	}
}

// solveBad returns a solution text for challenge whose digest has fewer
// than bits leading zero bits.
func solveBad(challenge string, bits int) string {
	for n := 0; ; n++ {
		s := challenge + "." + strconv.Itoa(n)
		if !hasWork(s, bits) {
			return s
		}
	}
}

func TestProofOfWork(t *testing.T) {
	clock := newClock(t0)
	l := mustNew(t, testConfig(clock))
	ctx := context.Background()
	ch, err := l.NewChallenge(alice, 8)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Difficulty != 8 || !ch.Expires.Equal(t0.Add(DefaultChallengeLifetime)) {
		t.Fatalf("challenge %+v", ch)
	}
	sol, err := Solve(ctx, ch.Value)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sol, ch.Value+".") {
		t.Fatalf("solution %q does not extend the challenge", sol)
	}
	if err := l.VerifySolution(sol, alice, 8); err != nil {
		t.Fatalf("valid solution: %v", err)
	}
	if err := l.VerifySolution(sol, alice, 0); err != nil {
		t.Fatalf("valid solution, lower requirement: %v", err)
	}

	other, _ := l.NewChallenge(bob, 8)
	otherSol, _ := Solve(ctx, other.Value)
	easy, _ := l.NewChallenge(alice, 2)
	easySol, _ := Solve(ctx, easy.Value)
	zero, _ := l.NewChallenge(alice, 0)
	counter := sol[strings.LastIndexByte(sol, '.')+1:]
	nonce, _ := l.NewNonce(alice)
	tests := []struct {
		name     string
		solution string
		want     error
	}{
		{"empty", "", ErrTokenMissing},
		{"no counter", ch.Value, ErrTokenMalformed},
		{"empty counter", ch.Value + ".", ErrTokenMalformed},
		{"leading zero", ch.Value + ".0" + counter, ErrTokenMalformed},
		{"plus sign", ch.Value + ".+" + counter, ErrTokenMalformed},
		{"minus sign", ch.Value + ".-1", ErrTokenMalformed},
		{"space", ch.Value + ". " + counter, ErrTokenMalformed},
		{"17 digits", ch.Value + ".12345678901234567", ErrTokenMalformed},
		{"above MaxCounter", ch.Value + "." + strconv.FormatUint(MaxCounter+1, 10), ErrTokenMalformed},
		{"two dots", ch.Value + ".1.2", ErrTokenMalformed},
		{"nonce as challenge", nonce + ".1", ErrTokenUnknownVersion},
		{"tampered challenge", "B" + sol[1:], ErrTokenMalformed},
		{"wrong subject", otherSol, ErrTokenInvalid},
		{"difficulty too low", easySol, ErrDifficultyTooLow},
		{"insufficient work", solveBad(ch.Value, 8), ErrWorkInsufficient},
	}
	for _, tt := range tests {
		if err := l.VerifySolution(tt.solution, alice, 8); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	// Difficulty 0 needs no work: any counter does.
	if err := l.VerifySolution(zero.Value+".0", alice, 0); err != nil {
		t.Fatalf("difficulty 0: %v", err)
	}
	// The difficulty byte is covered by the MAC.
	raw := decodeToken(t, ch.Value)
	raw[len(raw)-macLen-17] = 0
	lowered := b64.EncodeToString(raw) + ".0"
	if err := l.VerifySolution(lowered, alice, 0); !errors.Is(err, ErrTokenInvalid) {
		t.Fatalf("lowered difficulty: %v", err)
	}
	// A difficulty above MaxDifficulty is malformed even with a valid MAC.
	body := []byte{challengeV1, 1, 0x7f, MaxDifficulty + 1}
	body = append(body, make([]byte, 16)...)
	if err := l.VerifySolution(craft(l, purposeChallenge, body, alice)+".0", alice, 0); !errors.Is(err, ErrTokenMalformed) {
		t.Fatalf("difficulty above max: %v", err)
	}

	clock.Add(DefaultChallengeLifetime)
	if err := l.VerifySolution(sol, alice, 8); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("expired: %v", err)
	}

	if _, err := l.NewChallenge(alice, -1); !errors.Is(err, ratekit.ErrInvalidRequest) {
		t.Fatalf("difficulty -1: %v", err)
	}
	if _, err := l.NewChallenge(alice, MaxDifficulty+1); !errors.Is(err, ratekit.ErrInvalidRequest) {
		t.Fatalf("difficulty too high: %v", err)
	}
	if err := l.VerifySolution(sol, "", 0); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Fatalf("empty subject: %v", err)
	}
}

func TestProofOfWorkReplayCache(t *testing.T) {
	cfg := testConfig(newClock(t0))
	cfg.ReplayCacheSize = 16
	l := mustNew(t, cfg)
	ch, _ := l.NewChallenge(alice, 4)
	sol, _ := Solve(context.Background(), ch.Value)
	if err := l.VerifySolution(sol, alice, 4); err != nil {
		t.Fatal(err)
	}
	if err := l.VerifySolution(sol, alice, 4); !errors.Is(err, ErrTokenReplayed) {
		t.Fatalf("second use: %v", err)
	}
	// A second solution of the same challenge is a replay too.
	other := solveFrom(t, ch.Value, 4, sol)
	if err := l.VerifySolution(other, alice, 4); !errors.Is(err, ErrTokenReplayed) {
		t.Fatalf("another solution of a used challenge: %v", err)
	}
}

// solveFrom finds a solution of challenge other than not.
func solveFrom(t *testing.T, challenge string, bits int, not string) string {
	t.Helper()
	for n := 0; n < 1<<20; n++ {
		s := challenge + "." + strconv.Itoa(n)
		if s != not && hasWork(s, bits) {
			return s
		}
	}
	t.Fatal("no second solution")
	return ""
}

func TestSolve(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	if _, err := Solve(context.Background(), "junk"); !errors.Is(err, ErrTokenMalformed) {
		t.Fatalf("junk: %v", err)
	}
	ch, _ := l.NewChallenge(alice, MaxDifficulty)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Solve(ctx, ch.Value); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	// The solution found is the first counter that works, as a browser
	// loop from 0 would find.
	ch, _ = l.NewChallenge(alice, 6)
	sol, err := Solve(context.Background(), ch.Value)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(sol[strings.LastIndexByte(sol, '.')+1:])
	for i := range n {
		if hasWork(ch.Value+"."+strconv.Itoa(i), 6) {
			t.Fatalf("counter %d works but Solve returned %d", i, n)
		}
	}
}

func TestLeadingZeroBits(t *testing.T) {
	var s [32]byte
	if leadingZeroBits(s) != 256 {
		t.Fatal("all zero")
	}
	s[0] = 0x80
	if leadingZeroBits(s) != 0 {
		t.Fatal("0x80")
	}
	s[0], s[1] = 0, 0x01
	if leadingZeroBits(s) != 15 {
		t.Fatal("0x0001")
	}
}

func TestLengths(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	ch, _ := l.NewChallenge(alice, 3)
	if len(ch.Value) != 55 {
		t.Errorf("challenge is %d characters, want 55 (doc)", len(ch.Value))
	}
	if n := len(tokenAt(l, t0.Unix(), 127, alice)); n != 34 {
		t.Errorf("typical token is %d characters, want 34 (doc)", n)
	}
	sc := l.keys.signing.get(purposeToken)
	defer l.keys.signing.put(purposeToken, sc)
	tf := tokenFields{kid: 255, start: maxUnixSeconds, count: 1<<63 - 1, ttl: maxTTLSeconds}
	if n := len(b64.EncodeToString(append(tf.appendBody(nil), tf.mac[:]...))); n != 51 {
		t.Errorf("longest token is %d characters, want 51 (doc)", n)
	}
}
