package signedwindow

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
)

// MaxCompositePolicies is the most policies a [Composite] takes.
const MaxCompositePolicies = 8

// CompositeConfig configures a [Composite]: several fixed-window policies
// on one subject, all counted in one token.
type CompositeConfig struct {
	// Policies are the composite's policies, in the order of
	// Decision.Parts and Request.Parts: 1 to MaxCompositePolicies, each
	// with a distinct valid name (see [ratekit.ValidatePolicyName]), a
	// Quota of at least 1 and a Window of whole seconds from 1 second to
	// MaxWindow, as [Config] requires of one policy. The whole policy set
	// (every name, quota and window, in order) is bound into the key
	// derivation and every MAC: a token of one set is worthless against
	// another, and against a single-policy [Limiter].
	Policies []ratekit.Policy

	// Keys, Now and MaxSkew are as in [Config].
	Keys    []Key
	Now     func() time.Time
	MaxSkew time.Duration
}

// Composite is a signed-window limiter of several policies ("10 a second
// and 1,000 a day") whose counts all travel in one token (format version
// 2). It implements [ratekit.Limiter], [ratekit.Peeker] and
// [ratekit.Refunder] with the guarantees and limits of [Limiter]: a friction
// layer, not a security boundary (a client that drops its token starts
// afresh).
//
// A request is admitted only when every policy has its cost available, and
// then every policy takes it; a denial by any policy takes from none (the
// token comes back with the same counts). Each policy keeps its own window,
// which starts at the first request counted in it and which the token
// carries; a policy whose window has ended starts a new one at its next
// request while the others keep theirs. The Decision holds one part per
// policy, summed up as [ratekit.Decision.Parts] documents.
//
// The token is bound to one subject, Request.Key: a request whose
// Request.Parts name another key is refused with an error matching
// [ratekit.ErrInvalidRequest] (per-policy keys, "per user and per
// organisation", need a server-side composite). Parts may give each policy
// its own cost. There is no replay cache: [Config.ReplayCacheSize] has no
// counterpart here, so a client that replays an older token of its own is
// not caught; use a single-policy [Limiter] with the cache where that
// matters. Nonces and proof-of-work challenges are not offered; a [Limiter]
// of one of the policies issues them.
//
// Refund follows the rules of [Limiter.Refund] without a cache, policy by
// policy: it gives units back only in a window that the accepted token
// names and that has not ended, never moving a window; a token that is not
// accepted gives nothing back.
//
// A Composite is safe for concurrent use by multiple goroutines.
type Composite struct {
	scratch  sync.Pool // of *cscratch
	policies []ratekit.Policy
	windows  []int64 // seconds, per policy
	set      string  // the canonical policy set, bound into the derived keys
	setID    string  // 16 bytes of SHA-256(set), bound into every MAC
	now      func() time.Time
	maxSkew  time.Duration
	keys     *keyring
}

// Interfaces implemented by *Composite.
var (
	_ ratekit.Limiter  = (*Composite)(nil)
	_ ratekit.Peeker   = (*Composite)(nil)
	_ ratekit.Refunder = (*Composite)(nil)
)

// NewComposite returns a Composite for cfg, deriving the MAC keys once. It
// returns an error matching [ratekit.ErrInvalidConfig] when cfg is invalid
// (see [CompositeConfig]).
func NewComposite(cfg CompositeConfig) (*Composite, error) {
	n := len(cfg.Policies)
	if n < 1 || n > MaxCompositePolicies {
		return nil, configErr("a composite needs 1 to %d policies, got %d", MaxCompositePolicies, n)
	}
	c := &Composite{policies: append([]ratekit.Policy(nil), cfg.Policies...)}
	var set strings.Builder
	set.WriteString("composite")
	for i, p := range cfg.Policies {
		one, err := Config{Name: p.Name, Quota: p.Quota, Window: p.Window, Keys: cfg.Keys, Now: cfg.Now, MaxSkew: cfg.MaxSkew}.withDefaults()
		if err != nil {
			return nil, configErr("policy %d: %v", i, err)
		}
		for _, q := range cfg.Policies[:i] {
			if q.Name == p.Name {
				return nil, configErr("policy name %q appears twice", p.Name)
			}
		}
		c.now, c.maxSkew = one.Now, one.MaxSkew
		c.windows = append(c.windows, int64(p.Window/time.Second))
		// Names hold no ';' ',' or '=': the encoding is unambiguous.
		set.WriteString("," + p.Name + ";q=" + strconv.FormatInt(p.Quota, 10) + ";w=" + strconv.FormatInt(c.windows[i], 10))
	}
	c.set = set.String()
	sum := sha256.Sum256([]byte(c.set))
	c.setID = string(sum[:16])
	kr, err := newKeyring(cfg.Keys, c.set)
	if err != nil {
		return nil, configErr("deriving keys: %v", err)
	}
	c.keys = kr
	c.scratch.New = func() any { return new(cscratch) }
	return c, nil
}

// cscratch is the per-call working memory of a composite decision, pooled
// so that the hot path allocates little but the returned token and parts.
type cscratch struct {
	raw [maxCompositeRaw]byte
	enc [maxCompositeText]byte
	msg [1 + 3*3 + maxCompositeRaw + 16 + ratekit.MaxKeyLen]byte
	sum [32]byte
}

// Policies returns a copy of the composite's policies.
func (c *Composite) Policies() []ratekit.Policy {
	return append([]ratekit.Policy(nil), c.policies...)
}

// Allow takes each policy's cost (req.Cost, or req.Parts[i].Cost) from the
// windows carried in req.State when every policy has it available, and
// otherwise takes nothing. The new token is in Decision.State. A missing
// or unacceptable token (the reason is in Decision.StateError) starts every
// policy afresh; this is not an error.
//
// Allow returns an error, and no decision, when req is invalid (an
// [ratekit.ErrInvalidRequest] from [ratekit.Request.Validate], parts of
// the wrong number or of another key than req.Key, or
// [ratekit.ErrCostExceedsQuota] when a cost is above its policy's quota),
// when ctx is done (the error wraps ctx.Err()), or when the clock reads a
// time before 1970. req.IdempotencyKey is ignored.
func (c *Composite) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.decide(ctx, req, opAllow)
}

// Peek reports the decision Allow would make for req now, without taking
// anything. Decision.State is req.State when nothing would change in it,
// and otherwise a newly signed token of the counts Peek used. It returns
// the same errors as Allow.
func (c *Composite) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.decide(ctx, req, opPeek)
}

// Refund gives each policy its cost back in the window the accepted token
// in req.State names (never below 0), and returns the decision with Allowed
// true and the new token in Decision.State. A policy whose window has ended
// gets nothing back, and a token that is not accepted gives nothing back
// (Refund then answers as Peek does). Refunding the same token twice gives
// back once. It returns the same errors as Allow.
func (c *Composite) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.decide(ctx, req, opRefund)
}

// cwin is one policy's window in a composite token.
type cwin struct {
	start, count, ttl int64
}

func (c *Composite) validate(req ratekit.Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if req.Parts != nil && len(req.Parts) != len(c.policies) {
		return fmt.Errorf("signedwindow: %w: %d parts for a composite of %d policies", ratekit.ErrInvalidRequest, len(req.Parts), len(c.policies))
	}
	for i, p := range c.policies {
		cost := req.Cost
		if req.Parts != nil {
			if req.Parts[i].Key != req.Key {
				return fmt.Errorf("signedwindow: %w: part %d has another key than the request; a composite token is bound to one subject", ratekit.ErrInvalidRequest, i)
			}
			cost = req.Parts[i].Cost
		}
		if cost > p.Quota {
			return fmt.Errorf("%w (policy %q: cost %d, quota %d)", ratekit.ErrCostExceedsQuota, p.Name, cost, p.Quota)
		}
	}
	return nil
}

// decide answers req by op: it checks the request and the clock, reads the
// request's token, counts every policy's window and signs the answer's
// token when a window or count changed.
func (c *Composite) decide(ctx context.Context, req ratekit.Request, op op) (ratekit.Decision, error) {
	if err := c.validate(req); err != nil {
		return ratekit.Decision{}, err
	}
	now, err := readClock(ctx, c.now)
	if err != nil {
		return ratekit.Decision{}, err
	}
	signer := c.keys.signing
	sc := signer.get(purposeToken)
	defer signer.put(purposeToken, sc)
	cs := c.scratch.Get().(*cscratch)
	defer c.scratch.Put(cs)

	n := len(c.policies)
	// ws holds each policy's window: read from the token, then updated in
	// place. Arrays sized for MaxCompositePolicies stay on the stack.
	var (
		wsBuf [MaxCompositePolicies]cwin
		costs [MaxCompositePolicies]int64
		live  [MaxCompositePolicies]bool // policy i's window in the token is still running
	)
	ws := wsBuf[:n]
	kid, stateErr := c.readToken(sc, cs, req.State, req.Key, now, ws)
	valid := stateErr == nil
	fresh := c.open(ws, live[:n], valid, now.Unix())
	for i := range ws {
		costs[i] = req.Cost
		if req.Parts != nil {
			costs[i] = req.Parts[i].Cost
		}
	}
	// The parts are the Decision's own (one allocation), filled in place.
	parts := make([]ratekit.Decision, n)
	counted := c.count(op, ws, costs[:n], live[:n], parts)
	c.answer(parts, ws, now)
	d := ratekit.Combine(parts)
	d.StateError = stateErr
	if !valid || kid != signer.id || fresh || counted {
		d.State = c.signToken(sc, cs, ws, req.Key)
	} else {
		d.State = req.State
	}
	return d, nil
}

// open marks in live the windows of ws that the token (valid) names and
// that still run at nowSec, and starts the others afresh. It reports
// whether it started any.
func (c *Composite) open(ws []cwin, live []bool, valid bool, nowSec int64) bool {
	fresh := false
	for i := range ws {
		w := &ws[i]
		if valid && nowSec < w.start+c.windows[i] && nowSec < w.start+w.ttl {
			live[i] = true
			continue
		}
		// No window, or this policy's window has ended: a fresh one.
		*w = cwin{start: nowSec, ttl: c.windows[i]}
		fresh = true
	}
	return fresh
}

// count decides op for every policy i at costs[i], setting
// parts[i].Allowed, and applies it to ws: a take allowed by every policy
// adds every cost, a refund gives each live window its cost back (never
// below 0). It reports whether a count changed.
func (c *Composite) count(op op, ws []cwin, costs []int64, live []bool, parts []ratekit.Decision) bool {
	all := true
	for i := range ws {
		ok := op == opRefund || ws[i].count <= c.policies[i].Quota-costs[i]
		parts[i].Allowed = ok
		all = all && ok
	}
	changed := false
	switch {
	case op == opAllow && all:
		for i := range ws {
			ws[i].count += costs[i]
		}
		changed = true
	case op == opRefund:
		for i := range ws {
			if live[i] && ws[i].count > 0 {
				ws[i].count = max(ws[i].count-costs[i], 0)
				changed = true
			}
		}
	}
	return changed
}

// answer fills in each part's figures from its window in ws at now.
func (c *Composite) answer(parts []ratekit.Decision, ws []cwin, now time.Time) {
	for i := range parts {
		p, d := &c.policies[i], &parts[i]
		reset := time.Unix(ws[i].start+c.windows[i], 0).Sub(now)
		d.Quota = p.Quota
		d.Remaining = min(max(p.Quota-ws[i].count, 0), p.Quota)
		d.ResetAfter = reset
		d.Policy = *p
		if !d.Allowed {
			d.RetryAfter = reset
		}
	}
}

// Composite token, format version 2: the unpadded base64url encoding of
//
//	version   1 byte   0x02; the algorithm as in version 1
//	key ID    1 byte
//	n         1 byte   number of policies, 1 to MaxCompositePolicies
//	n times:  length   1 byte, then that many bytes:
//	            start  uvarint  window start, Unix seconds
//	            count  uvarint  units used in the window
//	            expiry uvarint  seconds from start until the window's token expires
//	MAC       16 bytes HMAC-SHA256(K, PAE(fields, set ID, subject)), truncated
//
// K is derived as for version 1 with the canonical policy set (every name,
// quota and window, in order) in place of the policy name; the set ID is
// the first 16 bytes of its SHA-256, so that the MAC input of a typical
// token fits one SHA-256 block.
//
// Varints are minimal and each length covers its three varints exactly.
const (
	tokenV2 = 0x02

	maxCWinLen       = 6 + 9 + 5 // widest start, count, expiry
	maxCompositeRaw  = 3 + MaxCompositePolicies*(1+maxCWinLen) + macLen
	maxCompositeText = (maxCompositeRaw*8 + 5) / 6
)

// appendCompositeBody appends the signed fields of a composite token.
func appendCompositeBody(b []byte, kid uint8, ws []cwin) []byte {
	b = append(b, tokenV2, kid, byte(len(ws)))
	for _, w := range ws {
		var f [maxCWinLen]byte
		e := binary.AppendUvarint(f[:0], uint64(w.start))
		e = binary.AppendUvarint(e, uint64(w.count))
		e = binary.AppendUvarint(e, uint64(w.ttl))
		b = append(b, byte(len(e)))
		b = append(b, e...)
	}
	return b
}

// parseCompositeToken parses decoded composite token bytes into ws (whose
// length is the number of windows the caller expects, at most
// MaxCompositePolicies; nil accepts any number and fills nothing) and
// returns the key ID, the number of windows, and the length of the signed
// body.
func parseCompositeToken(raw []byte, ws []cwin) (kid uint8, n, bodyLen int, err error) {
	if len(raw) < 3 {
		return 0, 0, 0, ErrTokenMalformed
	}
	if raw[0] != tokenV2 {
		return 0, 0, 0, ErrTokenUnknownVersion
	}
	kid, n = raw[1], int(raw[2])
	if n < 1 || n > MaxCompositePolicies || (ws != nil && n != len(ws)) || len(raw) < 3+macLen {
		return 0, 0, 0, ErrTokenMalformed
	}
	bodyLen = len(raw) - macLen
	i := 3
	for k := 0; k < n; k++ {
		if i >= bodyLen {
			return 0, 0, 0, ErrTokenMalformed
		}
		l := int(raw[i])
		i++
		if l < 3 || l > maxCWinLen || i+l > bodyLen {
			return 0, 0, 0, ErrTokenMalformed
		}
		w, ok := parseCWin(raw[i : i+l])
		if !ok {
			return 0, 0, 0, ErrTokenMalformed
		}
		if ws != nil {
			ws[k] = w
		}
		i += l
	}
	if i != bodyLen {
		return 0, 0, 0, ErrTokenMalformed
	}
	return kid, n, bodyLen, nil
}

// parseCWin parses one window's fields f (its three varints, exactly),
// reporting false for malformed ones.
func parseCWin(f []byte) (cwin, bool) {
	var w cwin
	var m, j int
	if w.start, m = readUvarint(f); m == 0 || w.start > maxUnixSeconds {
		return cwin{}, false
	}
	j += m
	if w.count, m = readUvarint(f[j:]); m == 0 {
		return cwin{}, false
	}
	j += m
	if w.ttl, m = readUvarint(f[j:]); m == 0 || w.ttl > maxTTLSeconds {
		return cwin{}, false
	}
	return w, j+m == len(f)
}

// compositeMAC computes the truncated HMAC of PAE(body, set ID, subject) with
// h (keyed with a derived key), as scratch.mac does for version 1, building
// the input in cs.msg. body may alias cs.raw but not cs.msg.
func compositeMAC(h hash.Hash, cs *cscratch, out *[macLen]byte, body []byte, set, subject string) {
	m := append(cs.msg[:0], 3)
	m = binary.AppendUvarint(m, uint64(len(body)))
	m = append(m, body...)
	m = binary.AppendUvarint(m, uint64(len(set)))
	m = append(m, set...)
	m = binary.AppendUvarint(m, uint64(len(subject)))
	m = append(m, subject...)
	h.Reset()
	h.Write(m)
	h.Sum(cs.sum[:0])
	copy(out[:], cs.sum[:macLen])
}

// readToken decodes and verifies the composite token s for subject at now
// into ws, returning its key ID or one of the ErrToken* sentinels. Windows
// that have ended are returned as they are; the caller starts them afresh.
func (c *Composite) readToken(sc *scratch, cs *cscratch, s, subject string, now time.Time, ws []cwin) (uint8, error) {
	if s == "" {
		return 0, ErrTokenMissing
	}
	raw := cs.raw[:]
	n, ok := decodeStrict(raw, cs.enc[:], s, maxCompositeRaw)
	if !ok {
		return 0, ErrTokenMalformed
	}
	kid, _, bodyLen, err := parseCompositeToken(raw[:n], ws)
	if err != nil {
		return 0, err
	}
	var want [macLen]byte
	if kid == c.keys.signing.id {
		compositeMAC(sc.h, cs, &want, raw[:bodyLen], c.setID, subject)
	} else {
		other := c.keys.byID[kid]
		if other == nil {
			return 0, ErrTokenUnknownKey
		}
		osc := other.get(purposeToken)
		compositeMAC(osc.h, cs, &want, raw[:bodyLen], c.setID, subject)
		other.put(purposeToken, osc)
	}
	if !hmac.Equal(want[:], raw[bodyLen:n]) {
		return 0, ErrTokenInvalid
	}
	nowSec := now.Unix()
	for _, w := range ws {
		if ahead := w.start - nowSec; ahead > 0 && (ahead > maxTTLSeconds ||
			time.Duration(ahead)*time.Second-time.Duration(now.Nanosecond()) > c.maxSkew) {
			return 0, ErrTokenFuture
		}
	}
	return kid, nil
}

// signToken returns the text of a composite token of windows ws for
// subject, signed with the signing key; sc belongs to it.
func (c *Composite) signToken(sc *scratch, cs *cscratch, ws []cwin, subject string) string {
	body := appendCompositeBody(cs.raw[:0], c.keys.signing.id, ws)
	var mac [macLen]byte
	compositeMAC(sc.h, cs, &mac, body, c.setID, subject)
	body = append(body, mac[:]...)
	b64.Encode(cs.enc[:], body)
	return string(cs.enc[:b64.EncodedLen(len(body))])
}
