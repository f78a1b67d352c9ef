package ratekit

import "time"

// Combine returns the Decision of a composite limiter whose policies decided
// parts, one per policy in policy order, by the rule [Decision.Parts]
// documents: Allowed when every part admitted; when any denied, RetryAfter is
// the longest among the denying parts; Quota, Remaining, ResetAfter and Policy
// are those of the most restrictive part (the smallest Remaining, ties broken
// by the longest ResetAfter, then by the earlier part), chosen among the
// denying parts when any denied. Parts is set to parts itself; State and
// StateError are left for the caller. Combine of no parts is the zero
// Decision. Every ratekit composite answers through it; a composite limiter of
// your own can too. It is safe for concurrent use and does not modify parts.
func Combine(parts []Decision) Decision {
	if len(parts) == 0 {
		return Decision{}
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
	d := Decision{
		Allowed:    allowed,
		Quota:      m.Quota,
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
