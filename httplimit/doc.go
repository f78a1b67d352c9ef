// Package httplimit puts a [ratekit.Limiter] in front of HTTP handlers: a
// [Guard] turns each decision into the answer every transport shares (the
// RateLimit-Policy and RateLimit header fields of
// draft-ietf-httpapi-ratelimit-headers-10, Retry-After, and an RFC 9457
// problem+json body for 429 and 503), applies the failure policy the caller
// chose ([FailClosed], [FailOpen], [UseFallback]) and carries client state
// in a header field and a cookie. [Middleware] wraps a net/http handler;
// package lambda wraps Lambda handlers with the same Guard. Key functions
// ([RemoteAddrKey], [ForwardedForKey], [HeaderIPKey], [APIKeyHeaderKey])
// derive the key a request is counted under. It imports package ratekit
// and the standard library only.
package httplimit
