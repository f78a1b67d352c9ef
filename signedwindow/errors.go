package signedwindow

import "errors"

// Reasons a signed value is not accepted. The limiter reports them for window
// tokens in [ratekit.Decision.StateError] (the request is still decided, on a
// fresh count), and returns them from [Limiter.VerifyToken],
// [Limiter.VerifyNonce] and [Limiter.VerifySolution], wrapped with detail
// that names the kind of value. Compare with errors.Is.
var (
	// ErrTokenMissing reports that the request carried no token: a new
	// client, or one that dropped its token.
	ErrTokenMissing = errors.New("signedwindow: no token")

	// ErrTokenMalformed reports a value that is not a well-formed encoding:
	// bad base64url, a non-minimal varint, a wrong length, trailing bytes.
	ErrTokenMalformed = errors.New("signedwindow: malformed token")

	// ErrTokenUnknownVersion reports a version byte this package does not
	// know. It also matches ErrTokenMalformed.
	ErrTokenUnknownVersion error = unknownVersionError{}

	// ErrTokenUnknownKey reports a key ID that is not among [Config.Keys]:
	// the key was removed from the rotation, or the value was not issued by
	// this deployment.
	ErrTokenUnknownKey = errors.New("signedwindow: token signed by an unknown key")

	// ErrTokenInvalid reports a MAC that does not verify: the value was
	// edited or forged, or it was issued to another subject or for another
	// policy. These causes cannot be told apart, by design: the subject and
	// the policy name are covered by the MAC but not carried in the value.
	ErrTokenInvalid = errors.New("signedwindow: token signature does not verify")

	// ErrTokenExpired reports a value past its expiry time.
	ErrTokenExpired = errors.New("signedwindow: token expired")

	// ErrTokenStaleWindow reports a window token whose window has ended, by
	// the limiter's current [Config.Window]: the client is in a new window.
	ErrTokenStaleWindow = errors.New("signedwindow: token from a past window")

	// ErrTokenFuture reports a value dated further in the future than
	// [Config.MaxSkew] allows: a window starting later than now plus
	// MaxSkew, or a nonce or challenge expiring later than this limiter
	// would ever set. It points to an instance with a fast clock or to a
	// forged value signed with a leaked key.
	ErrTokenFuture = errors.New("signedwindow: token dated too far in the future")

	// ErrTokenReplayed reports a value this process has seen before, found
	// in the replay cache ([Config.ReplayCacheSize]). For a window token it
	// means the token carries a lower count than one this process already
	// issued for the same subject and window (a replay, or two tabs sharing
	// a token); it is informational: the request is counted from the higher
	// count. A nonce or a solution that is used again is refused.
	ErrTokenReplayed = errors.New("signedwindow: token already used")

	// ErrDifficultyTooLow reports a proof-of-work challenge easier than the
	// difficulty the verifier requires now (the count rose since it was
	// issued).
	ErrDifficultyTooLow = errors.New("signedwindow: challenge difficulty below the required difficulty")

	// ErrWorkInsufficient reports a proof-of-work solution whose SHA-256
	// digest does not have the challenge's number of leading zero bits.
	ErrWorkInsufficient = errors.New("signedwindow: solution does not meet the challenge difficulty")
)

// unknownVersionError is ErrTokenUnknownVersion: it reads as
// fmt.Errorf("%w: unknown version", ErrTokenMalformed) would and matches
// ErrTokenMalformed, but costs nothing at package initialisation.
type unknownVersionError struct{}

func (unknownVersionError) Error() string { return "signedwindow: malformed token: unknown version" }

func (unknownVersionError) Unwrap() error { return ErrTokenMalformed }
