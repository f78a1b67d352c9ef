// Package compose sums up the decisions of a composite limiter's policies
// into the one Decision its caller sees, by the rule that
// [ratekit.Decision.Parts] documents. Every backend's composite uses it, so
// they all answer alike.
package compose

import (
	"time"

	"github.com/ratekit/ratekit"
)

// Sum returns the Decision that holds parts: Allowed when every part
// admitted; when any denied, RetryAfter is the longest among the denying
// parts; Limit, Remaining, ResetAfter and Policy are those of the most
// restrictive part (the smallest Remaining, ties broken by the longest
// ResetAfter, then by the earlier part), chosen among the denying parts when
// any denied. Parts is set to parts itself; State and StateError are left
// for the caller. Sum of no parts is the zero Decision.
func Sum(parts []ratekit.Decision) ratekit.Decision {
	if len(parts) == 0 {
		return ratekit.Decision{}
	}
	allowed := true
	for i := range parts {
		if !parts[i].Allowed {
			allowed = false
			break
		}
	}
	pick := -1
	var retry time.Duration
	for i := range parts {
		p := &parts[i]
		if !allowed && p.Allowed {
			continue
		}
		if !p.Allowed && p.RetryAfter > retry {
			retry = p.RetryAfter
		}
		if pick < 0 || p.Remaining < parts[pick].Remaining ||
			p.Remaining == parts[pick].Remaining && p.ResetAfter > parts[pick].ResetAfter {
			pick = i
		}
	}
	m := &parts[pick]
	d := ratekit.Decision{
		Allowed:    allowed,
		Limit:      m.Limit,
		Remaining:  m.Remaining,
		ResetAfter: m.ResetAfter,
		Policy:     m.Policy,
		Parts:      parts,
	}
	if !allowed {
		d.RetryAfter = retry
	}
	return d
}
