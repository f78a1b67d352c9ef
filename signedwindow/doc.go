// Package signedwindow is the ratekit strategy that stores nothing: the
// client carries its own count in a signed token.
//
// A [Limiter] counts requests in fixed windows of [Config.Window], each
// starting at the client's first counted request. The window start and the
// units used so far travel in a token signed with HMAC-SHA256, returned in
// [ratekit.Decision.State] and sent back in [ratekit.Request.State] (the
// ratekit HTTP middleware carries it in a header or cookie). A decision
// costs two HMACs and no round trip, which suits functions that may run on
// a fresh instance for every request.
//
// A token cannot be forged, edited, moved to another subject
// ([ratekit.Request.Key]) or used against another policy, so a client that
// keeps sending the token it was given is held to the limit. A client that
// drops its token starts a fresh count, and one that replays an older token
// of its own is counted from that token while its window lasts. The
// optional replay cache ([Config.ReplayCacheSize]) catches both, inside one
// warm instance only. Treat this strategy as a friction layer against
// floods, runaway scripts and casual abuse; for quotas that must hold
// against a determined client, use package tokenbucket or durable.
//
// [Limiter.Refund] gives units back only in a window that an accepted token
// names. A [Composite] ([NewComposite]) counts several policies on one
// subject in one token, and takes from every policy or from none. A Limiter
// also issues signed nonces ([Limiter.NewNonce]) and proof-of-work
// challenges ([Limiter.NewChallenge]) whose difficulty can rise with the
// count. There is no Reset method: there is no stored state to forget, and
// a client gets a full quota by dropping its token anyway.
//
// See docs/signedwindow.md in the repository for the token formats, key
// derivation, the refund rules and the replay cache.
package signedwindow
