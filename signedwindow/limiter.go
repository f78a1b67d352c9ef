package signedwindow

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/ratekit/ratekit"
)

// Limiter is a fixed-window rate limiter whose state travels with the
// client in a signed token. It implements [ratekit.Limiter],
// [ratekit.Peeker] and [ratekit.Refunder], and issues nonces and
// proof-of-work challenges for the same policy.
//
// It does not implement [ratekit.Resetter]: nothing is stored, so there is
// nothing to forget (a client that drops its token already starts afresh).
//
// A Limiter is safe for concurrent use by multiple goroutines. Create one
// with [New] and share it.
type Limiter struct {
	name      string
	limit     int64
	window    time.Duration
	windowSec int64
	now       func() time.Time
	maxSkew   time.Duration
	nonceTTL  time.Duration
	chalTTL   time.Duration
	diff      DifficultyPolicy
	keys      *keyring
	replay    *replayCache // nil when disabled
	random    func([]byte) (int, error)
}

// Interfaces implemented by *Limiter.
var (
	_ ratekit.Limiter  = (*Limiter)(nil)
	_ ratekit.Peeker   = (*Limiter)(nil)
	_ ratekit.Refunder = (*Limiter)(nil)
)

// New returns a Limiter for cfg. It derives the MAC keys once, here. It
// returns an error matching [ratekit.ErrInvalidConfig] when cfg is invalid:
// see [Config] for the rules of each field.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	kr, err := newKeyring(cfg.Keys, cfg.Name)
	if err != nil {
		return nil, configErr("deriving keys: %v", err)
	}
	l := &Limiter{
		name:      cfg.Name,
		limit:     cfg.Quota,
		window:    cfg.Window,
		windowSec: int64(cfg.Window / time.Second),
		now:       cfg.Now,
		maxSkew:   cfg.MaxSkew,
		nonceTTL:  cfg.NonceLifetime,
		chalTTL:   cfg.ChallengeLifetime,
		diff:      *cfg.Difficulty,
		keys:      kr,
		random:    rand.Read,
	}
	if cfg.ReplayCacheSize > 0 {
		l.replay = newReplayCache(cfg.ReplayCacheSize)
	}
	return l, nil
}

// Policy returns the limiter's policy: its name, its Quota and
// Window.
func (l *Limiter) Policy() ratekit.Policy {
	return ratekit.Policy{Name: l.name, Quota: l.limit, Window: l.window, Algorithm: ratekit.FixedWindow}
}

// Allow takes req.Cost units from the window carried in req.State for the
// subject req.Key, and returns the decision with the new token in
// Decision.State. The client must send that token with its next request.
//
// When req.State is missing or not acceptable (see the Err* variables; the
// reason is in Decision.StateError) the request is counted in a fresh window
// that starts now: this is not an error. A denied request takes nothing;
// Decision.State is then still a valid token for the same count. RetryAfter
// is the time to the end of the window when denied and 0 when allowed;
// ResetAfter is the time to the end of the window.
//
// Allow returns an error, and no decision, when req is invalid (a
// [ratekit.ErrInvalidRequest] from [ratekit.Request.Validate], or
// [ratekit.ErrCostExceedsQuota] when req.Cost is above Quota), when ctx is
// done (the error wraps ctx.Err()), or when the clock reads a time before
// 1970. req.IdempotencyKey is ignored: the strategy keeps no record of past
// requests.
func (l *Limiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return l.decide(ctx, req, opAllow)
}

// Peek reports the decision Allow would make for req now, without taking
// anything. Decision.State is req.State when that token was accepted, is
// signed by the current key and its count is unchanged; otherwise it is a
// newly signed token for the count Peek used (a fresh window starting now
// when req.State was not accepted). It returns the same errors as Allow.
func (l *Limiter) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return l.decide(ctx, req, opPeek)
}

// Refund gives req.Cost units back to the window carried in req.State (the
// count never goes below 0) and returns the decision with Allowed true and
// the new token in Decision.State. Pass the state of the request that was
// charged, or better the token its Allow returned. A refund never moves the
// window the subject is counted in:
//
//   - Without a replay cache, an accepted token is refunded in its own
//     window. Refunding the same token again gives the same answer, so the
//     units come back once.
//   - With [Config.ReplayCacheSize], an accepted token is refunded in the
//     window Allow would charge it in: the remembered window when the token
//     is of the same or an earlier window (a replayed token, reported as
//     [ErrTokenReplayed], is refunded from the remembered count), otherwise
//     the token's own window (issued by another instance), which the cache
//     adopts only when it remembers no live window for the subject. The
//     token Allow returned refunds once however often it is sent; each
//     refund with an older token (such as the one the charged request
//     carried, which Allow's answer made a replay) gives units back again.
//   - A token that is not accepted (missing, forged, for another subject or
//     policy, expired, of a window that has ended) names no window the
//     request was charged in, so nothing is given back: Refund answers as
//     [Limiter.Peek] does, with the reason in Decision.StateError. With the
//     cache that is the remembered window at its count; without it, a fresh
//     window at count 0, no more than a client gets by sending no token.
//     A request sent without a token is therefore charged and not refunded.
//
// It returns the same errors as Allow.
func (l *Limiter) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return l.decide(ctx, req, opRefund)
}

type op uint8

const (
	opAllow op = iota
	opPeek
	opRefund
)

// decide answers req by op: it checks the request and the clock, reads
// the request's token, counts it (count) and signs the answer's token.
func (l *Limiter) decide(ctx context.Context, req ratekit.Request, op op) (ratekit.Decision, error) {
	now, err := l.check(ctx, &req)
	if err != nil {
		return ratekit.Decision{}, err
	}

	signer := l.keys.signing
	sc := signer.get(purposeToken)
	defer signer.put(purposeToken, sc)

	tf, stateErr := l.readToken(sc, req.State, req.Key, now)
	valid := stateErr == nil
	w := window{start: now.Unix(), expires: (now.Unix() + l.windowSec) * 1000}
	if valid {
		w = window{start: tf.start, count: tf.count, expires: (tf.start + min(tf.ttl, l.windowSec)) * 1000}
	}
	w, allowed, newCount := l.count(op, req.Key, req.Cost, valid, w, now.UnixMilli())
	if w.replayed {
		stateErr = ErrTokenReplayed
	}

	d := ratekit.Decision{
		Allowed:    allowed,
		Quota:      l.limit,
		Remaining:  min(max(l.limit-newCount, 0), l.limit),
		ResetAfter: time.Unix(w.start+l.windowSec, 0).Sub(now),
		Policy:     l.Policy(),
		StateError: stateErr,
	}
	if !allowed {
		d.RetryAfter = d.ResetAfter
	}
	if valid && w.start == tf.start && newCount == tf.count && tf.kid == l.keys.signing.id {
		// Nothing changed (a denial, a peek): hand the same token back.
		// A token signed by an older key is re-signed, so that it survives
		// the old key's removal.
		d.State = req.State
	} else {
		d.State = l.signToken(sc, w.start, newCount, req.Key)
	}
	return d, nil
}

// check returns the limiter's clock for a decision of req, or the error
// for a request that no decision takes: an invalid one, one with Parts, a
// cost above the quota, a done ctx or a clock outside 1970 to year 36812.
func (l *Limiter) check(ctx context.Context, req *ratekit.Request) (time.Time, error) {
	if err := req.Validate(); err != nil {
		return time.Time{}, err
	}
	if len(req.Parts) > 0 {
		return time.Time{}, ratekit.ErrUnexpectedParts
	}
	if req.Cost > l.limit {
		return time.Time{}, fmt.Errorf("%w (cost %d, quota %d)", ratekit.ErrCostExceedsQuota, req.Cost, l.limit)
	}
	return readClock(ctx, l.now)
}

// readClock returns now(), or an error when ctx is done (wrapping
// ctx.Err()) or the clock reads a time outside 1970 to year 36812.
func readClock(ctx context.Context, now func() time.Time) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("signedwindow: %w", err)
	}
	t := now()
	if sec := t.Unix(); sec < 0 || sec > maxUnixSeconds {
		return time.Time{}, fmt.Errorf("signedwindow: clock reads %v, outside 1970 to year 36812", t)
	}
	return t, nil
}

// count applies op with cost to w, the window that subject's token names
// (valid) or a fresh one, through the replay cache when there is one, and
// returns the window the subject is counted in, whether op is allowed,
// and the count the answer's token carries.
func (l *Limiter) count(op op, subject string, cost int64, valid bool, w window, nowMs int64) (window, bool, int64) {
	var key uint64
	if l.replay != nil {
		key = l.replay.windowKey(subject)
	}
	switch {
	case op == opAllow:
		allowed := w.count <= l.limit-cost
		if l.replay != nil {
			w, allowed = l.replay.spend(key, valid, w, cost, l.limit, nowMs)
		}
		if allowed {
			return w, true, w.count + cost
		}
		return w, false, w.count
	case op == opPeek || !valid:
		// A peek; or a refund whose token was not accepted, which names
		// no window the request was charged in: give nothing back, and
		// answer as Peek does. With the cache that is the remembered
		// window, so the answer never carries a window other than the
		// one the subject is counted in (a fresh window here would let
		// the next Allow adopt it and start over).
		if l.replay != nil {
			w = l.replay.peek(key, valid, w, nowMs)
		}
		return w, op == opRefund || w.count <= l.limit-cost, w.count
	case l.replay != nil:
		w = l.replay.refund(key, w, cost, nowMs)
		return w, true, w.count
	default:
		return w, true, max(w.count-cost, 0)
	}
}

// signToken returns the text of a token for the window starting at start
// with count units used, signed with the signing key. sc must belong to the
// signing key.
func (l *Limiter) signToken(sc *scratch, start, count int64, subject string) string {
	tf := tokenFields{kid: l.keys.signing.id, start: start, count: count, ttl: l.windowSec}
	body := tf.appendBody(sc.raw[:0])
	sc.mac(&tf.mac, body, l.name, subject)
	body = append(body, tf.mac[:]...)
	b64.Encode(sc.enc[:], body)
	return string(sc.enc[:b64.EncodedLen(len(body))])
}

// readToken decodes and verifies the token s for subject at now, using sc
// (a scratch of the signing key) for decoding. The error is one of the
// ErrToken* sentinels.
func (l *Limiter) readToken(sc *scratch, s, subject string, now time.Time) (tokenFields, error) {
	if s == "" {
		return tokenFields{}, ErrTokenMissing
	}
	n, ok := decodeStrict(sc.raw[:], sc.enc[:], s, maxRawLen)
	if !ok {
		return tokenFields{}, ErrTokenMalformed
	}
	tf, bodyLen, err := parseToken(sc.raw[:n])
	if err != nil {
		return tokenFields{}, err
	}
	if tf.kid == l.keys.signing.id {
		if !sc.verify(tf.mac[:], sc.raw[:bodyLen], l.name, subject) {
			return tokenFields{}, ErrTokenInvalid
		}
	} else {
		other := l.keys.byID[tf.kid]
		if other == nil {
			return tokenFields{}, ErrTokenUnknownKey
		}
		osc := other.get(purposeToken)
		ok := osc.verify(tf.mac[:], sc.raw[:bodyLen], l.name, subject)
		other.put(purposeToken, osc)
		if !ok {
			return tokenFields{}, ErrTokenInvalid
		}
	}
	// Checked in this order so that the usual case, a client coming back
	// after its window ended, reports a stale window.
	nowSec := now.Unix()
	if ahead := tf.start - nowSec; ahead > 0 && (ahead > maxTTLSeconds ||
		time.Duration(ahead)*time.Second-time.Duration(now.Nanosecond()) > l.maxSkew) {
		return tokenFields{}, ErrTokenFuture
	}
	if nowSec >= tf.start+l.windowSec {
		return tokenFields{}, ErrTokenStaleWindow
	}
	if nowSec >= tf.start+tf.ttl {
		return tokenFields{}, ErrTokenExpired
	}
	return tf, nil
}

// VerifyToken parses token and checks its signature for subject and its
// times against the limiter's clock, as Allow does, without consulting the
// replay cache. It returns an error matching [ratekit.ErrInvalidRequest]
// for an invalid subject (see [ratekit.ValidateKey]) and otherwise one of
// [ErrTokenMissing], [ErrTokenMalformed] (and [ErrTokenUnknownVersion]),
// [ErrTokenUnknownKey], [ErrTokenInvalid], [ErrTokenFuture],
// [ErrTokenStaleWindow] or [ErrTokenExpired].
func (l *Limiter) VerifyToken(token, subject string) (Token, error) {
	if err := ratekit.ValidateKey(subject); err != nil {
		return Token{}, err
	}
	sc := l.keys.signing.get(purposeToken)
	defer l.keys.signing.put(purposeToken, sc)
	tf, err := l.readToken(sc, token, subject, l.now())
	if err != nil {
		return Token{}, err
	}
	return tf.token(), nil
}
