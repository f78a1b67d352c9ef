package httplimit

import (
	"encoding/json"
	"math/bits"
	"net/http"
	"strconv"
	"time"

	"github.com/ratekit/ratekit"
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
// fills in Policy, so that r never exceeds q, is on [ratekit.Policy].
//
// Durations are advertised in whole seconds rounded up, so a client that waits
// as long as it is told is never early. The RateLimit t parameter is the time
// until additional quota is made available (the draft's section 4.3): on a
// denial, RetryAfter, so that Retry-After never points earlier than t (the
// draft's section 6); otherwise, for a token bucket (Policy.Algorithm), the
// time until its next whole unit (0 when it is full), and for the window
// algorithms ResetAfter, the end of the window (for a sliding log, the
// latest time by which its whole quota is back).
//
// For a decision of a composite limiter (d.Parts not nil), both fields are
// Structured Fields lists (RFC 9651, section 3.1) with one member per part,
// in the order of the parts, as draft-ietf-httpapi-ratelimit-headers-10
// allows for several policies (sections 3 and 4: each field is a List of
// quota policy items):
//
//	RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400
//	RateLimit: "burst";r=9;t=1, "daily";r=998;t=51000
//
// Each member's t follows its own part (its RetryAfter when that part
// denied). Retry-After and the legacy fields follow the top-level
// Decision, which sums the parts up (see [ratekit.Decision.Parts]): Retry-After is
// the longest wait among the parts that denied, so it is never earlier than
// their t; a part that did not deny keeps its own t, which may be later, as
// more of its quota is not what the request waits for.
//
// A policy name that is not printable ASCII cannot be written as a Structured
// Fields string (RFC 9651, section 3.3.3); its field (or list member) is then
// omitted, since clients must ignore malformed fields anyway. So is a list
// member of no name (a part that [ratekit.All] could not ask). Retry-After is
// still written. SetHeaders is safe for concurrent use on distinct headers.
func SetHeaders(h http.Header, d ratekit.Decision, legacy bool) {
	if d.Parts != nil {
		setListHeaders(h, d.Parts)
	} else if name := d.Policy.Name; sfValid(name) {
		b := make([]byte, 0, len(name)+40)
		b = appendPolicyItem(b, name, d.Policy)
		h[canonRateLimitPolicy] = []string{string(b)}
		b = appendLimitItem(b[:0], name, d)
		h[canonRateLimit] = []string{string(b)}
	}
	if !d.Allowed {
		h[canonRetryAfter] = []string{strconv.FormatInt(retryAfterSeconds(d), 10)}
	}
	if legacy {
		h[canonXRateLimitLimit] = []string{strconv.FormatInt(nonNegative(d.Quota), 10)}
		h[canonXRateLimitRemaining] = []string{strconv.FormatInt(nonNegative(d.Remaining), 10)}
		h[canonXRateLimitReset] = []string{strconv.FormatInt(resetSeconds(d), 10)}
	}
}

// setListHeaders writes the RateLimit-Policy and RateLimit fields as lists
// of one member per part, leaving out the parts whose name cannot be
// written, and deleting the fields when no part's can.
func setListHeaders(h http.Header, parts []ratekit.Decision) {
	b := make([]byte, 0, 48*len(parts))
	for _, p := range parts {
		if p.Policy.Name != "" && sfValid(p.Policy.Name) {
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = appendPolicyItem(b, p.Policy.Name, p.Policy)
		}
	}
	if len(b) == 0 {
		delete(h, canonRateLimitPolicy)
		delete(h, canonRateLimit)
		return
	}
	h[canonRateLimitPolicy] = []string{string(b)}
	b = b[:0]
	for _, p := range parts {
		if p.Policy.Name != "" && sfValid(p.Policy.Name) {
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = appendLimitItem(b, p.Policy.Name, p)
		}
	}
	h[canonRateLimit] = []string{string(b)}
}

// appendPolicyItem appends the RateLimit-Policy item of p, named name
// (which sfValid accepted).
func appendPolicyItem(b []byte, name string, p ratekit.Policy) []byte {
	b = appendSFString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, nonNegative(p.Quota), 10)
	if p.Window > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, ceilSeconds(p.Window), 10)
	}
	return b
}

// appendLimitItem appends the RateLimit item of d, named name.
func appendLimitItem(b []byte, name string, d ratekit.Decision) []byte {
	b = appendSFString(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, nonNegative(d.Remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ceilSeconds(untilMore(d)), 10)
}

// untilMore returns the time until d's policy makes additional quota
// available, the RateLimit t parameter (see SetHeaders).
func untilMore(d ratekit.Decision) time.Duration {
	if !d.Allowed {
		return max(d.RetryAfter, time.Second)
	}
	if d.Policy.Algorithm != ratekit.TokenBucket {
		return d.ResetAfter
	}
	q, r := d.Policy.Quota, d.Remaining
	if r >= q || q < 1 || d.Policy.Window <= 0 {
		return 0
	}
	// The bucket is full in ResetAfter, and a unit takes Window/q: the next
	// whole unit comes q−r−1 units' time before it is full.
	hi, lo := bits.Mul64(uint64(q-r-1), uint64(d.Policy.Window))
	before, _ := bits.Div64(hi, lo, uint64(q))
	return max(d.ResetAfter-time.Duration(before), 0)
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
// (for a composite decision, the name of every part that denied, in the
// order of the parts) and the wait (the top-level RetryAfter) in the
// detail. The body is JSON of media type [ProblemContentType].
func DeniedProblem(d ratekit.Decision) []byte {
	p := Problem{
		Type:   ProblemTypeQuotaExceeded,
		Title:  "Too many requests: the quota of this policy is used up",
		Status: http.StatusTooManyRequests,
		Detail: "Retry in " + strconv.FormatInt(retryAfterSeconds(d), 10) + " s.",
	}
	if d.Parts != nil {
		for _, part := range d.Parts {
			if !part.Allowed && part.Policy.Name != "" {
				p.ViolatedPolicies = append(p.ViolatedPolicies, part.Policy.Name)
			}
		}
	} else if d.Policy.Name != "" {
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

// sfValid reports whether s can be written as a Structured Fields string:
// printable ASCII only.
func sfValid(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// appendSFString appends s, which sfValid accepted, as a Structured Fields
// string (RFC 9651, section 3.3.3): quoted, with '"' and '\\' escaped.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

func resetSeconds(d ratekit.Decision) int64 {
	if !d.Allowed {
		return retryAfterSeconds(d)
	}
	return ceilSeconds(d.ResetAfter)
}

// retryAfterSeconds is at least 1 on a denial: a zero delay would invite an
// immediate retry that is denied again.
func retryAfterSeconds(d ratekit.Decision) int64 {
	return max(ceilSeconds(d.RetryAfter), 1)
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func nonNegative(n int64) int64 { return max(n, 0) }
