// Package signedwindow is the ratekit strategy that stores nothing: the
// client carries its own count in a signed token.
//
// A [Limiter] counts requests in fixed windows of [Config.Window]. The window
// of a client starts at its first counted request (windows are not aligned to
// the clock, so clients do not all reset at the same instant). The window
// start and the units used so far travel in a token that the limiter signs
// with HMAC-SHA256 (RFC 2104) and returns in [ratekit.Decision.State]; the
// client sends it back in [ratekit.Request.State] (the ratekit HTTP middleware
// carries it in a header or cookie). On every request the limiter verifies
// the token, counts, and signs the new count. Nothing is written anywhere, so
// a decision costs two HMACs and no round trip, which suits functions that may
// run on a fresh instance for every request.
//
// # What it guarantees, and what it does not
//
// A token cannot be forged or edited without the secret, cannot be moved to
// another subject ([ratekit.Request.Key], usually the client IP or API key)
// and cannot be used against another policy: the MAC covers both without the
// token carrying them. So a client that keeps sending the token it was given
// is held to the limit. That stops accidental floods, misbehaving scripts and
// retry loops, and casual abuse.
//
// It does not stop a client that drops its token: a request without a valid
// token starts a fresh count, because the limiter has no memory to compare it
// with. (For the same reason a client whose key changes, a phone moving
// between networks when the key is the client IP, starts afresh.) Nor does it stop a client that replays an older token of its own
// (one with a lower count) while that token's window lasts. The optional
// per-process replay cache ([Config.ReplayCacheSize]) catches the re-use of
// older tokens, and counts requests without a token in the subject's current
// window, inside one warm instance only; requests that land on other
// instances, or on a fresh one, are not caught. Treat this strategy as a
// friction layer; for quotas that must hold against a determined client, use
// a server-side strategy (ratekit's tokenbucket or durable packages). The
// proof-of-work helpers ([Limiter.NewChallenge], [Limiter.VerifySolution])
// add a per-request CPU price that rises with the count, which makes
// dropping tokens and flooding expensive rather than impossible.
//
// # Refunds
//
// [Limiter.Refund] gives units back only in a window that an accepted token
// names, and never moves the window a subject is counted in. Without the
// replay cache it lowers the count of the token it is given (the same token
// twice gives back once). With the cache it lowers the count of the window
// Allow would charge that token in, the remembered one for a token of the
// same or an earlier window. A refund whose token is not accepted (none, a
// forged one, one of a window that has ended) gives nothing back and
// answers as [Limiter.Peek] does: with the cache, the remembered window at
// its count, so dropping the token on calls that are refunded cannot win a
// fresh window; without it, a fresh window at count 0, which a client gets
// anyway by sending no token. A call charged in one window and refunded
// after that window ended is not refunded in the next one.
//
// # Token format, version 1
//
// A token is the unpadded base64url encoding (RFC 4648, section 5) of
//
//	version   1 byte   0x01; fixes the algorithm: HMAC-SHA256 truncated to 128 bits
//	key ID    1 byte   the Key.ID whose derived key signed the token
//	start     uvarint  window start, Unix seconds
//	count     uvarint  units used in the window
//	expiry    uvarint  seconds from start until the token expires (the window length at issue)
//	MAC       16 bytes HMAC-SHA256(K, PAE(fields, policy name, subject)), truncated
//
// A token is at most 51 characters of the URL-safe alphabet (34 for a
// one-minute window and a count below 128), so it fits a cookie or a header
// field without escaping.
// Every token has exactly one accepted encoding: the decoder is
// base64.RawURLEncoding.Strict() with line breaks refused, varints must be
// minimal and no byte may follow the MAC. PAE is the pre-authentication
// encoding of PASETO (the number of pieces, then a length before every
// piece; here the integers are minimal unsigned varints rather than PASETO's
// 64-bit words, so a typical input fits one SHA-256 block). No two different
// inputs share a MAC input, the flaw behind CVE-2025-68113 in ALTCHA. There is no algorithm field to confuse
// (CVE-2015-9235); MACs are compared in constant time with [hmac.Equal].
//
// The MAC key K is derived from [Key.Secret] with HKDF-SHA256 (RFC 5869),
// with the policy name and the purpose (token, nonce, challenge) in the info
// string, so each policy and each kind of signed value has its own key.
//
// # Several policies in one token
//
// A [Composite] ([NewComposite]) counts several fixed-window policies on one
// subject ("10 a second and 1,000 a day") in one token of format version 2,
// the unpadded base64url encoding of
//
//	version   1 byte   0x02; the algorithm as in version 1
//	key ID    1 byte
//	n         1 byte   number of policies, 1 to MaxCompositePolicies
//	n times:  length   1 byte, then that many bytes: start, count and
//	                   expiry as in version 1 (minimal uvarints, exactly
//	                   filling the length)
//	MAC       16 bytes HMAC-SHA256(K, PAE(fields, set ID, subject)), truncated
//
// K is derived as for version 1 with the canonical policy set (every name,
// quota and window, in order) in place of the policy name, and the set ID is
// the first 16 bytes of its SHA-256: a token of one policy set is worthless
// against another and against a single-policy Limiter. A request is
// admitted only when every policy has its cost available, and a denial by
// any policy takes from none. It offers Peek and Refund with the rules
// above, and no replay cache.
//
// # Anti-abuse helpers
//
// A [Limiter] also issues two stateless, subject-bound, expiring signed
// values: nonces ([Limiter.NewNonce], [Limiter.VerifyNonce]) that prove a
// client fetched something from you recently, and hashcash-style
// proof-of-work challenges after Adam Back's hashcash (2002)
// ([Limiter.NewChallenge], [Limiter.VerifySolution], [Solve]) whose
// difficulty can rise with the client's count ([Limiter.Difficulty]).
//
// There is no Reset method (the limiter does not implement
// [ratekit.Resetter]): there is no stored state to forget, and a client
// already gets a full quota by dropping its token.
package signedwindow
