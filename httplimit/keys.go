package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// KeyFunc derives the rate-limit key of an HTTP request. It returns an error
// (matching [ErrNoKey] for the key functions of this package) when the request
// carries no usable key; [Middleware] answers such requests with 400 rather
// than letting them through unlimited.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is matched by the errors of this package's key functions when a
// request carries no usable key: no parseable client address, too few
// X-Forwarded-For entries, an empty API key header. Such an error reads
// "httplimit: no usable rate-limit key: " and what was missing.
var ErrNoKey = errors.New("no usable rate-limit key")

// IP keys are "ip:" followed by the address. IPv4 addresses (including
// IPv4-mapped IPv6) are used whole. IPv6 addresses are reduced to their /64
// prefix, because one subscriber normally holds a whole /64 and could
// otherwise rotate through 2^64 addresses to escape the limit.
const ipv6PrefixBits = 64

// IPKey returns the rate-limit key for a client address: "ip:" and the
// address, with IPv6 reduced to its /64 prefix (for example
// "ip:2001:db8:1:2::/64"). It is the key the IP-based key functions return;
// adapters for other transports (the lambda package) use it so that keys
// agree across transports.
func IPKey(addr netip.Addr) string {
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return "ip:" + addr.String()
	}
	p, _ := addr.Prefix(ipv6PrefixBits)
	return "ip:" + p.String()
}

// maxIPText is the longest text, white space included, that ParseIPKey
// reads: an IPv6 address with an embedded IPv4 address is 45 bytes, and a
// zone or some white space fits in the rest. Longer input is refused by its
// length before it is read, so refusing it costs the same whatever its size.
const maxIPText = 100

// maxAPIKeyLen is the longest value APIKey hashes, in bytes: room for
// bearer tokens (JWTs) with many claims; API Gateway allows 10 KiB per
// header field. Longer values are refused by their length.
const maxAPIKeyLen = 16 << 10

// ParseIPKey parses s as a client IP address (no port, no brackets) and
// returns its [IPKey]. It returns an error matching [ErrNoKey] when s is
// not an IP address, and without reading s when it is longer than 100
// bytes.
func ParseIPKey(s string) (string, error) {
	if len(s) > maxIPText {
		return "", fmt.Errorf("httplimit: %w: %d bytes is too long for an IP address", ErrNoKey, len(s))
	}
	addr, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("httplimit: %w: %q is not an IP address", ErrNoKey, s)
	}
	return IPKey(addr), nil
}

// RemoteAddrKey returns a KeyFunc that keys requests by the address of the
// connection (http.Request.RemoteAddr), as an [IPKey]. Use it when clients
// connect to the server directly, or when the platform rewrites RemoteAddr to
// the client's address. A RemoteAddr without a port (as aws-lambda-go's
// lambdaurl sets it) is accepted.
func RemoteAddrKey() KeyFunc {
	return func(r *http.Request) (string, error) {
		host := r.RemoteAddr
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		return ParseIPKey(host)
	}
}

// ForwardedForKey returns a KeyFunc that keys requests by the right-most
// untrusted X-Forwarded-For entry, as an [IPKey].
//
// trustedProxies is the number of reverse proxies in front of this server
// that append to X-Forwarded-For, counting the one that connects to it (1 for
// a single load balancer). Each appends the address it received the request
// from, so the client's address is the trustedProxies-th entry from the
// right; everything to its left was written by the client and is never used.
// The left-most entry in particular is whatever the client chose to send.
// All X-Forwarded-For fields of the request are read as one list (RFC 9110,
// section 5.3).
//
// It returns an error matching [ratekit.ErrInvalidConfig] when trustedProxies is
// below 1; the KeyFunc returns an error matching [ErrNoKey] when the list has
// fewer than trustedProxies entries or that entry is not an IP address.
func ForwardedForKey(trustedProxies int) (KeyFunc, error) {
	if trustedProxies < 1 {
		return nil, configErr("ForwardedForKey needs at least 1 trusted proxy, got %d", trustedProxies)
	}
	return func(r *http.Request) (string, error) {
		return ForwardedForClient(r.Header.Values("X-Forwarded-For"), trustedProxies)
	}, nil
}

// ForwardedForClient returns the [IPKey] of the right-most untrusted entry of
// the X-Forwarded-For field lines in values, given trustedProxies appending
// proxies, as [ForwardedForKey] describes. Adapters that receive headers in
// another form (the lambda package) use it directly. It reads the lines from
// the right and stops at the entry it uses; an entry it passes or uses that
// is longer than 100 bytes is refused with [ErrNoKey] without being read, so
// the cost does not grow with what a client writes.
func ForwardedForClient(values []string, trustedProxies int) (string, error) {
	if trustedProxies < 1 {
		return "", configErr("at least 1 trusted proxy is needed, got %d", trustedProxies)
	}
	need := trustedProxies
	for i := len(values) - 1; i >= 0; i-- {
		line := values[i]
		for {
			// Look for the comma before the last entry in at most
			// maxIPText+1 bytes: a longer entry is not an address, and
			// scanning no further keeps the cost independent of what the
			// client wrote to the left.
			tail := line[max(len(line)-maxIPText-1, 0):]
			j := strings.LastIndexByte(tail, ',')
			if j < 0 && len(tail) < len(line) {
				return "", fmt.Errorf("httplimit: %w: an X-Forwarded-For entry is longer than %d bytes", ErrNoKey, maxIPText)
			}
			if j >= 0 {
				j += len(line) - len(tail)
			}
			entry := line[j+1:]
			if need--; need == 0 {
				return ParseIPKey(entry)
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return "", fmt.Errorf("httplimit: %w: X-Forwarded-For has fewer than %d entries", ErrNoKey, trustedProxies)
}

// HeaderIPKey returns a KeyFunc that keys requests by the client address in
// one header field set by a trusted proxy, such as "Fly-Client-IP" or
// "CF-Connecting-IP". The proxy must overwrite the field, or a client can set
// it. The field must appear exactly once and hold one IP address.
//
// It returns an error matching [ratekit.ErrInvalidConfig] for an invalid field name;
// the KeyFunc returns an error matching [ErrNoKey] when the field is missing,
// repeated or not an IP address.
func HeaderIPKey(name string) (KeyFunc, error) {
	if !isToken(name) {
		return nil, configErr("%q is not a valid header field name", name)
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header[name]
		if len(v) != 1 {
			return "", fmt.Errorf("httplimit: %w: want exactly one %s field, got %d", ErrNoKey, name, len(v))
		}
		return ParseIPKey(v[0])
	}, nil
}

// APIKeyHeaderKey returns a KeyFunc that keys requests by an API key sent in
// the named header field. A value of the form "Bearer <token>" is reduced to
// the token. The key is "key:" and the first 128 bits of the key's SHA-256 in
// hex, so stores and logs never hold the API key itself and every key has
// the same short length.
//
// The limit is only as good as the key: use it behind authentication, or an
// attacker invents a new key for every request. It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid field name; the KeyFunc returns an error
// matching [ErrNoKey] when the field is missing or empty.
func APIKeyHeaderKey(name string) (KeyFunc, error) {
	if !isToken(name) {
		return nil, configErr("%q is not a valid header field name", name)
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		return APIKey(r.Header.Get(name))
	}, nil
}

// APIKey returns the rate-limit key for an API key value as
// [APIKeyHeaderKey] computes it, or an error matching [ErrNoKey] when the
// value is empty or longer than 16 KiB (refused by its length, before it is
// read or hashed).
func APIKey(value string) (string, error) {
	if len(value) > maxAPIKeyLen {
		return "", fmt.Errorf("httplimit: %w: API key field is %d bytes, more than %d", ErrNoKey, len(value), maxAPIKeyLen)
	}
	v := strings.TrimSpace(value)
	if len(v) >= 6 && strings.EqualFold(v[:6], "bearer") && (len(v) == 6 || v[6] == ' ' || v[6] == '\t') {
		v = strings.TrimSpace(v[6:])
	}
	if v == "" {
		return "", fmt.Errorf("httplimit: %w: empty API key", ErrNoKey)
	}
	sum := sha256.Sum256([]byte(v))
	return "key:" + hex.EncodeToString(sum[:16]), nil
}
