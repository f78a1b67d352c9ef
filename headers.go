package ratekit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Header field names written by [SetHeaders] and the HTTP adapters.
const (
	// HeaderRateLimitPolicy advertises the quota policy
	// (draft-ietf-httpapi-ratelimit-headers-10, section 3), for example
	// `"contact-form";q=5;w=60`.
	HeaderRateLimitPolicy = "RateLimit-Policy"

	// HeaderRateLimit advertises the current service limit
	// (draft-ietf-httpapi-ratelimit-headers-10, section 4), for example
	// `"contact-form";r=3;t=42`.
	HeaderRateLimit = "RateLimit"

	// HeaderRetryAfter is the Retry-After field of RFC 9110, section 10.2.3,
	// written in delay-seconds on denials.
	HeaderRetryAfter = "Retry-After"

	// Legacy header fields, written only when asked for. X-RateLimit-Reset
	// is in delay-seconds (like t), not a Unix time.
	HeaderXRateLimitLimit     = "X-RateLimit-Limit"
	HeaderXRateLimitRemaining = "X-RateLimit-Remaining"
	HeaderXRateLimitReset     = "X-RateLimit-Reset"
)

// Canonical forms (http.CanonicalHeaderKey) of the field names, written out
// so that importing the package computes nothing (TestCanonicalHeaderNames
// checks them): an http.Header must be keyed by them.
const (
	canonRateLimitPolicy     = "Ratelimit-Policy"
	canonRateLimit           = "Ratelimit"
	canonRetryAfter          = "Retry-After"
	canonXRateLimitLimit     = "X-Ratelimit-Limit"
	canonXRateLimitRemaining = "X-Ratelimit-Remaining"
	canonXRateLimitReset     = "X-Ratelimit-Reset"
)

// Problem types of draft-ietf-httpapi-ratelimit-headers-10, section 5, used in
// the application/problem+json bodies (RFC 9457) of denied and failed-closed
// responses.
const (
	ProblemTypeQuotaExceeded            = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemTypeTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

	// ProblemContentType is the media type of a problem details body
	// (RFC 9457, section 3).
	ProblemContentType = "application/problem+json"
)

// SetHeaders writes the RateLimit-Policy and RateLimit fields for d into h,
// replacing any present, and on a denial the Retry-After field. With legacy
// set it also writes X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset.
//
// RateLimit-Policy carries q = d.Policy.Quota and w = d.Policy.Window
// (draft-ietf-httpapi-ratelimit-headers-10, section 3.1), RateLimit carries
// r = d.Remaining and t (section 4.1); the rule by which every strategy
// fills in Policy, so that r never exceeds q, is on [Policy].
//
// Durations are advertised in whole seconds rounded up, so a client that waits
// as long as it is told is never early. The RateLimit t parameter is the time
// until more quota is available: RetryAfter on a denial (so Retry-After and t
// agree, as section 6 of the draft requires) and ResetAfter otherwise.
//
// A policy name that is not printable ASCII cannot be written as a Structured
// Fields string (RFC 9651, section 3.3.3); the RateLimit fields are then
// omitted, since clients must ignore malformed fields anyway. Retry-After is
// still written. SetHeaders is safe for concurrent use on distinct headers.
func SetHeaders(h http.Header, d Decision, legacy bool) {
	if name, ok := sfString(d.Policy.Name); ok {
		b := make([]byte, 0, len(name)+32)
		b = append(b, name...)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, nonNegative(d.Policy.Quota), 10)
		if d.Policy.Window > 0 {
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, ceilSeconds(d.Policy.Window), 10)
		}
		h[canonRateLimitPolicy] = []string{string(b)}

		b = append(b[:0], name...)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, nonNegative(d.Remaining), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, resetSeconds(d), 10)
		h[canonRateLimit] = []string{string(b)}
	}
	if !d.Allowed {
		h[canonRetryAfter] = []string{strconv.FormatInt(retryAfterSeconds(d), 10)}
	}
	if legacy {
		h[canonXRateLimitLimit] = []string{strconv.FormatInt(nonNegative(d.Limit), 10)}
		h[canonXRateLimitRemaining] = []string{strconv.FormatInt(nonNegative(d.Remaining), 10)}
		h[canonXRateLimitReset] = []string{strconv.FormatInt(resetSeconds(d), 10)}
	}
}

// Problem is a problem details object (RFC 9457) as ratekit writes it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the policies whose quota was exceeded
	// (draft-ietf-httpapi-ratelimit-headers-10, section 5.1).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// DeniedProblem returns the problem details body for a denial: the draft's
// quota-exceeded type with status 429, the policy name in violated-policies
// and the wait in the detail. The body is JSON of media type
// [ProblemContentType].
func DeniedProblem(d Decision) []byte {
	p := Problem{
		Type:   ProblemTypeQuotaExceeded,
		Title:  "Too many requests: the quota of this policy is used up",
		Status: http.StatusTooManyRequests,
		Detail: "Retry in " + strconv.FormatInt(retryAfterSeconds(d), 10) + " s.",
	}
	if d.Policy.Name != "" {
		p.ViolatedPolicies = []string{d.Policy.Name}
	}
	return mustJSON(p)
}

func mustJSON(p Problem) []byte {
	b, err := json.Marshal(p)
	if err != nil {
		// Problem holds only strings and an int; Marshal cannot fail on it.
		return []byte(`{"type":"about:blank","status":500}`)
	}
	return b
}

// sfString renders s as a Structured Fields string, reporting false when s
// holds a byte outside printable ASCII.
func sfString(s string) (string, bool) {
	escape := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			return "", false
		}
		if c == '"' || c == '\\' {
			escape = true
		}
	}
	if !escape {
		return `"` + s + `"`, true
	}
	b := make([]byte, 0, len(s)+8)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"')), true
}

func resetSeconds(d Decision) int64 {
	if !d.Allowed {
		return retryAfterSeconds(d)
	}
	return ceilSeconds(d.ResetAfter)
}

// retryAfterSeconds is at least 1 on a denial: a zero delay would invite an
// immediate retry that is denied again.
func retryAfterSeconds(d Decision) int64 {
	return max(ceilSeconds(d.RetryAfter), 1)
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func nonNegative(n int64) int64 { return max(n, 0) }
