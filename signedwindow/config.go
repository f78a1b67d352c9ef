package signedwindow

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratekit/ratekit"
)

// MinSecretLen is the shortest [Key.Secret], in bytes, that [New] accepts:
// 256 bits, the output size of SHA-256. Shorter secrets are refused rather
// than padded (a zero-length HMAC key was CVE-2026-44699 in libjwt).
const MinSecretLen = 32

// MaxWindow is the longest [Config.Window] that [New] accepts.
const MaxWindow = 366 * 24 * time.Hour

// MaxDifficulty is the highest proof-of-work difficulty, in leading zero
// bits, that a challenge can carry. 2^32 hashes is hours of work in a
// browser; a policy never needs more.
const MaxDifficulty = 32

// Defaults applied by [New] to zero-valued [Config] fields.
const (
	// DefaultMaxSkew is the default [Config.MaxSkew].
	DefaultMaxSkew = 5 * time.Second

	// DefaultNonceLifetime is the default [Config.NonceLifetime].
	DefaultNonceLifetime = 10 * time.Second

	// DefaultChallengeLifetime is the default [Config.ChallengeLifetime]:
	// long enough for a person to fill in a form after the page solved its
	// challenge.
	DefaultChallengeLifetime = 5 * time.Minute
)

// DefaultDifficulty is the [DifficultyPolicy] that [New] uses when
// [Config.Difficulty] is nil: 16 bits (about 65 thousand SHA-256
// computations, a fraction of a second in a browser) for the first two
// requests of a window, 2 more bits (4 times the work) for each further
// request, at most 24 bits.
var DefaultDifficulty = DifficultyPolicy{Base: 16, Free: 2, Step: 2, Max: 24}

// Key is one HMAC secret of a [Limiter].
type Key struct {
	// ID names the key inside every value it signs, so that verification
	// picks the right key during a rotation. Any value from 0 to 255; IDs
	// must be unique within [Config.Keys]. It is not secret.
	ID uint8

	// Secret is the key material, at least MinSecretLen bytes from a
	// cryptographically secure source (for example 32 bytes from
	// crypto/rand, kept in a secret manager). All instances serving a
	// policy must share it. The limiter derives its MAC keys from it with
	// HKDF (RFC 5869) and does not keep or modify the slice.
	Secret []byte
}

// Config configures a [Limiter]. Zero-valued fields other than Name, Quota,
// Window and Keys take the defaults documented on each field.
type Config struct {
	// Name is the policy name, checked with [ratekit.ValidatePolicyName].
	// It is advertised in [ratekit.Policy] and bound into every MAC, so a
	// token of one policy is worthless against another.
	Name string

	// Quota is the number of units (requests, when every Cost is 1) that a
	// client may use per window. At least 1.
	Quota int64

	// Window is the length of a window: a whole number of seconds, from 1
	// second to MaxWindow. A client's window starts at its first request
	// without a valid token (rounded down to the second), and its full Quota
	// is available again when the window ends.
	Window time.Duration

	// Keys are the HMAC keys. Keys[0] signs every new value; all of them
	// verify. To rotate, put the new key first and keep the old one after
	// it for one Window (or the longest nonce or challenge lifetime, if
	// longer), then remove it: values signed by a removed key are refused
	// with [ErrTokenUnknownKey]. At least one key, at most 256, IDs unique,
	// each Secret at least MinSecretLen bytes.
	Keys []Key

	// Now returns the current time. Nil means time.Now. Tests inject a fake
	// clock here.
	Now func() time.Time

	// MaxSkew is how far ahead of this instance's clock a window may start
	// and still be honoured, to absorb clock skew between instances: a
	// token whose window starts at most MaxSkew in the future is counted
	// in that window; one that starts later is refused with
	// [ErrTokenFuture] and the client starts a fresh count. It also bounds
	// how much later than this limiter's own lifetimes a nonce or challenge
	// may expire. Zero means DefaultMaxSkew; a negative value means no
	// tolerance at all.
	MaxSkew time.Duration

	// ReplayCacheSize is the number of entries of a per-process cache that
	// catches clients re-using old tokens or dropping them inside one warm
	// instance. Zero (the default) disables it. With the cache, the limiter
	// remembers each subject's latest window and the highest count it
	// issued in it. A token that carries a lower count (a replayed token, or
	// one shared by two browser tabs) or an earlier window is counted from
	// the remembered window and count, reporting [ErrTokenReplayed]; a
	// request without a valid token joins the remembered window instead of
	// starting a fresh one. Requests for one subject that reach this
	// instance are therefore counted exactly, however many arrive at once
	// and whether or not they carry tokens. It also makes each nonce and
	// each solved challenge single-use within the instance. One entry is
	// kept per subject, nonce or challenge, until it expires or is evicted:
	// the cache is split into up to 16 shards with their own lock, and a
	// full shard evicts its oldest entry (first in, first out), expired or
	// not. Each entry takes 50 to 95 bytes of heap (measured with
	// runtime.MemStats by TestReplayCacheBytesPerEntry; the figure moves
	// within that range as the shards' maps grow), so 10,000 entries take
	// under 1 MB. It is allocated as entries are added: New reserves
	// nothing in proportion to the size, so any size is accepted and a
	// large one costs memory only as clients fill it. Requests seen only by
	// other instances, or whose entry was evicted, are not caught.
	ReplayCacheSize int

	// NonceLifetime is how long a nonce from [Limiter.NewNonce] stays
	// valid, at least 1 millisecond. Zero means DefaultNonceLifetime.
	NonceLifetime time.Duration

	// ChallengeLifetime is how long a proof-of-work challenge from
	// [Limiter.NewChallenge] stays valid, at least 1 millisecond. Zero
	// means DefaultChallengeLifetime.
	ChallengeLifetime time.Duration

	// Difficulty maps a client's count in its window to the proof-of-work
	// difficulty that [Limiter.Difficulty] reports. Nil means
	// DefaultDifficulty; &DifficultyPolicy{} means no work (0 bits) at any
	// count. New copies the policy.
	Difficulty *DifficultyPolicy
}

// DifficultyPolicy is a proof-of-work difficulty, in leading zero bits of a
// SHA-256 digest, that rises with the number of units a client has used in
// its window: Base bits while used is below Free, and
// Base + Step*(used-Free+1) bits from then on, at most Max. Each extra bit
// doubles the expected work.
type DifficultyPolicy struct {
	// Base is the difficulty for the first Free units of a window, from 0
	// (no work) to Max.
	Base int

	// Free is the number of units a client may use at Base difficulty. At
	// least 0.
	Free int64

	// Step is the number of bits added per unit used beyond Free. At least
	// 0.
	Step int

	// Max caps the difficulty, from Base to MaxDifficulty.
	Max int
}

// Bits returns the difficulty for a client that has used units of its window
// so far (a negative used counts as 0). p must be valid (see [New]).
func (p DifficultyPolicy) Bits(used int64) int {
	if used < p.Free || p.Step == 0 {
		return p.Base
	}
	// used >= Free >= 0, so neither difference overflows; with extra and
	// Step both at most Max (32), neither does the product.
	extra := used - p.Free
	if extra >= int64(p.Max) || p.Step > p.Max {
		return p.Max
	}
	bits := int64(p.Base) + (extra+1)*int64(p.Step)
	if bits > int64(p.Max) {
		return p.Max
	}
	return int(bits)
}

func (p DifficultyPolicy) validate() error {
	switch {
	case p.Max < 0 || p.Max > MaxDifficulty:
		return configErr("Difficulty.Max must be 0 to %d, got %d", MaxDifficulty, p.Max)
	case p.Base < 0 || p.Base > p.Max:
		return configErr("Difficulty.Base must be 0 to Max (%d), got %d", p.Max, p.Base)
	case p.Free < 0:
		return configErr("Difficulty.Free must not be negative, got %d", p.Free)
	case p.Step < 0:
		return configErr("Difficulty.Step must not be negative, got %d", p.Step)
	}
	return nil
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "signedwindow: invalid config: " and format's text: every configuration
// error of this package is made here. Text it includes from another
// configuration error (ratekit's validators', or this package's own) drops
// that error's "<package>: invalid config: ", so the message says it once.
func configErr(format string, args ...any) error {
	msg := strings.NewReplacer("ratekit: invalid config: ", "", "signedwindow: invalid config: ", "").Replace(fmt.Sprintf(format, args...))
	return fmt.Errorf("signedwindow: %w: %s", ratekit.ErrInvalidConfig, msg)
}

// withDefaults returns cfg with defaults applied, or an error wrapping
// ratekit.ErrInvalidConfig.
// cyclomatic: one flat check or default per Config field, in field order.
func (cfg Config) withDefaults() (Config, error) {
	if err := ratekit.ValidatePolicyName(cfg.Name); err != nil {
		return cfg, configErr("%v", err)
	}
	if cfg.Quota < 1 || cfg.Quota > ratekit.MaxQuota {
		return cfg, configErr("Quota must be from 1 to ratekit.MaxQuota, got %d", cfg.Quota)
	}
	if cfg.Window < time.Second || cfg.Window > MaxWindow || cfg.Window%time.Second != 0 {
		return cfg, configErr("Window must be a whole number of seconds from 1s to %v, got %v", MaxWindow, cfg.Window)
	}
	if len(cfg.Keys) == 0 || len(cfg.Keys) > 256 {
		return cfg, configErr("need 1 to 256 Keys, got %d", len(cfg.Keys))
	}
	var seen [256]bool
	for i, k := range cfg.Keys {
		if seen[k.ID] {
			return cfg, configErr("key ID %d appears twice in Keys", k.ID)
		}
		seen[k.ID] = true
		if len(k.Secret) < MinSecretLen {
			return cfg, configErr("Keys[%d] (ID %d) secret is %d bytes; need at least %d", i, k.ID, len(k.Secret), MinSecretLen)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.MaxSkew == 0:
		cfg.MaxSkew = DefaultMaxSkew
	case cfg.MaxSkew < 0:
		cfg.MaxSkew = 0
	}
	if cfg.ReplayCacheSize < 0 {
		return cfg, configErr("ReplayCacheSize must not be negative, got %d", cfg.ReplayCacheSize)
	}
	if cfg.NonceLifetime == 0 {
		cfg.NonceLifetime = DefaultNonceLifetime
	}
	if cfg.NonceLifetime < time.Millisecond {
		return cfg, configErr("NonceLifetime must be at least 1ms, got %v", cfg.NonceLifetime)
	}
	if cfg.ChallengeLifetime == 0 {
		cfg.ChallengeLifetime = DefaultChallengeLifetime
	}
	if cfg.ChallengeLifetime < time.Millisecond {
		return cfg, configErr("ChallengeLifetime must be at least 1ms, got %v", cfg.ChallengeLifetime)
	}
	if cfg.Difficulty == nil {
		cfg.Difficulty = &DefaultDifficulty
	}
	if err := cfg.Difficulty.validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}
