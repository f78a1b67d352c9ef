package signedwindow

import (
	"fmt"

	"github.com/ratekit/ratekit"
)

// NewNonce returns a new nonce for subject: an unpredictable, signed value
// that expires after [Config.NonceLifetime] (10 seconds by default) and is
// worthless for any other subject or policy. Hand it to the client (in a
// form, a header) and check it with [Limiter.VerifyNonce] when the client
// sends it back, to show that the client fetched it from you recently.
//
// Its text is base64url, 54 characters (until the year 2109). It returns
// an error matching [ratekit.ErrInvalidRequest] for an invalid subject (see
// [ratekit.ValidateKey]), and an error if the clock reads a time before
// 1970. It is safe for concurrent use.
func (l *Limiter) NewNonce(subject string) (string, error) {
	if err := ratekit.ValidateKey(subject); err != nil {
		return "", err
	}
	_, text, err := l.newStamp(purposeNonce, nonceV1, noncePayload, subject, l.nonceTTL, nil)
	return text, err
}

// VerifyNonce reports whether nonce was issued by [Limiter.NewNonce] of this
// policy (with any key in [Config.Keys]) for subject and has not expired.
//
// Without a replay cache a nonce can be used any number of times until it
// expires. With [Config.ReplayCacheSize] set, a nonce is accepted once per
// process: a second use returns [ErrTokenReplayed].
//
// It returns nil or an error matching [ratekit.ErrInvalidRequest] for an
// invalid subject, or one of [ErrTokenMissing], [ErrTokenMalformed] (and
// [ErrTokenUnknownVersion]), [ErrTokenUnknownKey], [ErrTokenInvalid] (a
// forged nonce, or one issued to another subject or policy),
// [ErrTokenExpired], [ErrTokenFuture] and [ErrTokenReplayed].
func (l *Limiter) VerifyNonce(nonce, subject string) error {
	if err := ratekit.ValidateKey(subject); err != nil {
		return err
	}
	now := l.now()
	st, err := l.verifyStamp(purposeNonce, nonceV1, noncePayload, nonce, subject, now, l.nonceTTL)
	if err != nil {
		return fmt.Errorf("%w (in the nonce)", err)
	}
	if l.replay != nil && l.replay.claim(macKey(st.mac), st.expires, now.UnixMilli()) {
		return fmt.Errorf("signedwindow: nonce: %w", ErrTokenReplayed)
	}
	return nil
}
