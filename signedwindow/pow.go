package signedwindow

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/ratekit/ratekit"
)

// MaxCounter is the largest proof-of-work counter a solution may carry:
// 2^53-1, the largest integer a JavaScript number holds exactly.
const MaxCounter = 1<<53 - 1

// maxCounterDigits is the number of decimal digits of MaxCounter.
const maxCounterDigits = 16

// Challenge is a proof-of-work challenge from [Limiter.NewChallenge], after
// Adam Back's hashcash (2002).
//
// To solve it, a client finds a counter n, a decimal integer from 0 to
// MaxCounter written without leading zeros, such that the SHA-256 digest of
// the ASCII text
//
//	Value + "." + n
//
// has at least Difficulty leading zero bits (bits counted from the most
// significant bit of the first byte). That text is the solution, which the
// client sends back for [Limiter.VerifySolution]. In a browser:
//
//	for (let n = 0; ; n++) {
//	  const text = value + "." + n;
//	  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
//	  if (leadingZeroBits(d) >= difficulty) return text;
//	}
//
// The expected number of attempts is 2^Difficulty. Go clients and tests can
// use [Solve].
type Challenge struct {
	// Value is the challenge text: base64url, 55 characters, signed,
	// bound to the subject and the policy, carrying Difficulty, the expiry
	// and a random salt.
	Value string

	// Difficulty is the number of leading zero bits the solution's digest
	// must have, from 0 to MaxDifficulty.
	Difficulty int

	// Expires is when the challenge, and any solution of it, stops being
	// accepted (millisecond precision).
	Expires time.Time
}

// Difficulty returns the proof-of-work difficulty, in bits, that
// [Config.Difficulty] sets for a client that has used units of its current
// window. With a [ratekit.Decision] d from [Limiter.Peek], the units used
// are d.Quota - d.Remaining.
func (l *Limiter) Difficulty(used int64) int {
	return l.diff.Bits(used)
}

// NewChallenge returns a new proof-of-work challenge for subject with the
// given difficulty (usually l.Difficulty(used)), expiring after
// [Config.ChallengeLifetime]. It returns an error matching
// [ratekit.ErrInvalidRequest] for an invalid subject (see
// [ratekit.ValidateKey]) or a difficulty outside 0 to MaxDifficulty, and an
// error if the clock reads a time before 1970. It is safe for concurrent
// use.
func (l *Limiter) NewChallenge(subject string, difficulty int) (Challenge, error) {
	if err := ratekit.ValidateKey(subject); err != nil {
		return Challenge{}, err
	}
	if difficulty < 0 || difficulty > MaxDifficulty {
		return Challenge{}, fmt.Errorf("signedwindow: %w: difficulty must be 0 to %d, got %d", ratekit.ErrInvalidRequest, MaxDifficulty, difficulty)
	}
	st, text, err := l.newStamp(purposeChallenge, challengeV1, challengePayload, subject, l.chalTTL, func(p []byte) {
		p[0] = byte(difficulty)
	})
	if err != nil {
		return Challenge{}, err
	}
	return Challenge{Value: text, Difficulty: difficulty, Expires: time.UnixMilli(st.expires)}, nil
}

// VerifySolution checks a proof-of-work solution (see [Challenge]) sent by
// subject: the challenge must have been issued by [Limiter.NewChallenge] of
// this policy for subject, must not have expired, must demand at least
// minDifficulty bits (pass l.Difficulty(used) for the client's count now, so
// a challenge fetched when the count was lower does not do), and the
// solution's SHA-256 digest must have that many leading zero bits. It costs
// one SHA-256 and one HMAC; a solution far longer than a valid one (more
// than 103 bytes) is refused by its length before it is read, so the cost
// does not grow with what the client sends.
//
// Without a replay cache a solution can be reused until its challenge
// expires. With [Config.ReplayCacheSize] set, each challenge is accepted once
// per process: a second solution of it returns [ErrTokenReplayed].
//
// It returns nil or an error matching [ratekit.ErrInvalidRequest] for an
// invalid subject, or one of [ErrTokenMissing], [ErrTokenMalformed] (and
// [ErrTokenUnknownVersion]), [ErrTokenUnknownKey], [ErrTokenInvalid],
// [ErrTokenExpired], [ErrTokenFuture], [ErrDifficultyTooLow],
// [ErrWorkInsufficient] and [ErrTokenReplayed].
func (l *Limiter) VerifySolution(solution, subject string, minDifficulty int) error {
	if err := ratekit.ValidateKey(subject); err != nil {
		return err
	}
	challenge, _, err := splitSolution(solution)
	if err != nil {
		return fmt.Errorf("%w (in the proof-of-work solution)", err)
	}
	now := l.now()
	st, err := l.verifyStamp(purposeChallenge, challengeV1, challengePayload, challenge, subject, now, l.chalTTL)
	if err != nil {
		return fmt.Errorf("%w (in the proof-of-work challenge)", err)
	}
	difficulty := int(st.payload[0])
	if difficulty < minDifficulty {
		return fmt.Errorf("%w (challenge %d bits, required %d)", ErrDifficultyTooLow, difficulty, minDifficulty)
	}
	if !hasWork(solution, difficulty) {
		return fmt.Errorf("%w (%d bits)", ErrWorkInsufficient, difficulty)
	}
	if l.replay != nil && l.replay.claim(macKey(st.mac), st.expires, now.UnixMilli()) {
		return fmt.Errorf("signedwindow: proof-of-work challenge: %w", ErrTokenReplayed)
	}
	return nil
}

// Solve finds the solution of challenge (the Value of a [Challenge]) by
// trying counters from 0 upwards, as a browser would, and returns it. It
// reads the difficulty from the challenge without verifying its signature.
// It returns an error matching [ErrTokenMalformed] for a malformed
// challenge, and ctx.Err() (wrapped) if ctx ends first; it checks ctx every
// 4096 attempts. Expect 2^difficulty SHA-256 computations on average
// (benchmarks/README.md gives solve times).
func Solve(ctx context.Context, challenge string) (string, error) {
	var st stamp
	var raw [maxRawLen]byte
	var src [maxEncLen]byte
	if _, err := parseStamp(&st, raw[:], src[:], challenge, challengeV1, challengePayload); err != nil {
		return "", fmt.Errorf("%w (in the proof-of-work challenge)", err)
	}
	difficulty := int(st.payload[0])
	buf := make([]byte, 0, len(challenge)+1+maxCounterDigits)
	buf = append(buf, challenge...)
	buf = append(buf, '.')
	prefix := len(buf)
	for n := uint64(0); n <= MaxCounter; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return "", fmt.Errorf("signedwindow: solving proof-of-work: %w", err)
			}
		}
		buf = strconv.AppendUint(buf[:prefix], n, 10)
		if leadingZeroBits(sha256.Sum256(buf)) >= difficulty {
			return string(buf), nil
		}
	}
	return "", fmt.Errorf("signedwindow: no proof-of-work solution up to counter %d", uint64(MaxCounter))
}

// splitSolution splits a solution into its challenge text and counter,
// checking the counter's form: 1 to 16 decimal digits, no leading zero
// (except "0" itself), at most MaxCounter.
func splitSolution(s string) (challenge string, counter uint64, err error) {
	if s == "" {
		return "", 0, ErrTokenMissing
	}
	// Refused by length before anything reads s, so that refusing a
	// solution costs the same whatever its size.
	if len(s) > maxEncLen+1+maxCounterDigits {
		return "", 0, ErrTokenMalformed
	}
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", 0, ErrTokenMalformed
	}
	digits := s[i+1:]
	if len(digits) == 0 || len(digits) > maxCounterDigits || (digits[0] == '0' && len(digits) > 1) {
		return "", 0, ErrTokenMalformed
	}
	for j := 0; j < len(digits); j++ {
		c := digits[j]
		if c < '0' || c > '9' {
			return "", 0, ErrTokenMalformed
		}
		counter = counter*10 + uint64(c-'0')
	}
	if counter > MaxCounter {
		return "", 0, ErrTokenMalformed
	}
	return s[:i], counter, nil
}

// hasWork reports whether SHA-256(solution) has at least difficulty
// leading zero bits.
func hasWork(solution string, difficulty int) bool {
	var buf [maxEncLen + 1 + maxCounterDigits]byte
	n := copy(buf[:], solution)
	return leadingZeroBits(sha256.Sum256(buf[:n])) >= difficulty
}

func leadingZeroBits(sum [sha256.Size]byte) int {
	for i, b := range sum {
		if b != 0 {
			return i*8 + bits.LeadingZeros8(b)
		}
	}
	return 8 * sha256.Size
}
