package signedwindow

import (
	"encoding/binary"
	"fmt"
	"time"
)

// A stamp is the common layout of nonces and proof-of-work challenges:
//
//	version  1 byte   nonceV1 or challengeV1; fixes the algorithm as for tokens
//	key ID   1 byte
//	expiry   uvarint  Unix milliseconds
//	payload  fixed    nonce: 16 random bytes; challenge: difficulty byte, 16-byte salt
//	MAC      16 bytes HMAC-SHA256(K, PAE(version..payload, policy name, subject)), truncated
//
// K is derived per purpose, so a nonce is never accepted as a challenge or
// a window token, and the reverse.
type stamp struct {
	ver     byte
	kid     uint8
	expires int64 // Unix milliseconds
	payload [maxPayload]byte
	plen    int
	mac     [macLen]byte
}

const (
	nonceV1     = 0x11
	challengeV1 = 0x21

	noncePayload     = 16
	challengePayload = 1 + 16
	maxPayload       = challengePayload

	maxUnixMillis = maxUnixSeconds*1000 + 999
)

func (st *stamp) appendBody(b []byte) []byte {
	b = append(b, st.ver, st.kid)
	b = binary.AppendUvarint(b, uint64(st.expires))
	return append(b, st.payload[:st.plen]...)
}

// String returns the text of the stamp.
func (st *stamp) String() string {
	var raw [maxRawLen]byte
	b := st.appendBody(raw[:0])
	b = append(b, st.mac[:]...)
	var enc [maxEncLen]byte
	b64.Encode(enc[:], b)
	return string(enc[:b64.EncodedLen(len(b))])
}

// parseStamp parses the text s of a stamp of version ver with a payload of
// plen bytes into st, decoding into raw and src. It returns the length of the
// signed body.
func parseStamp(st *stamp, raw, src []byte, s string, ver byte, plen int) (int, error) {
	if s == "" {
		return 0, ErrTokenMissing
	}
	n, ok := decodeStrict(raw, src, s, maxRawLen)
	if !ok {
		return 0, ErrTokenMalformed
	}
	b := raw[:n]
	if len(b) < 2 {
		return 0, ErrTokenMalformed
	}
	if b[0] != ver {
		return 0, ErrTokenUnknownVersion
	}
	st.ver, st.kid = b[0], b[1]
	bodyLen := len(b) - macLen
	if bodyLen < 3+plen {
		return 0, ErrTokenMalformed
	}
	var m int
	if st.expires, m = readUvarint(b[2:bodyLen]); m == 0 || st.expires > maxUnixMillis || 2+m+plen != bodyLen {
		return 0, ErrTokenMalformed
	}
	st.plen = copy(st.payload[:], b[2+m:bodyLen])
	copy(st.mac[:], b[bodyLen:])
	if ver == challengeV1 && st.payload[0] > MaxDifficulty {
		return 0, ErrTokenMalformed
	}
	return bodyLen, nil
}

// newStamp signs a new stamp of version ver for subject, expiring after
// lifetime, with payload filled by fill (after random bytes fill it).
func (l *Limiter) newStamp(p purpose, ver byte, plen int, subject string, lifetime time.Duration, fill func(payload []byte)) (stamp, string, error) {
	now := l.now()
	nowMs := now.UnixMilli()
	if nowMs < 0 || nowMs > maxUnixMillis-lifetime.Milliseconds() {
		return stamp{}, "", fmt.Errorf("signedwindow: clock reads %v, outside 1970 to year 36812", now)
	}
	st := stamp{ver: ver, kid: l.keys.signing.id, expires: nowMs + lifetime.Milliseconds(), plen: plen}
	if _, err := l.random(st.payload[:plen]); err != nil {
		return stamp{}, "", fmt.Errorf("signedwindow: reading random bytes: %w", err)
	}
	if fill != nil {
		fill(st.payload[:plen])
	}
	sc := l.keys.signing.get(p)
	body := st.appendBody(sc.raw[:0])
	sc.mac(&st.mac, body, l.name, subject)
	body = append(body, st.mac[:]...)
	b64.Encode(sc.enc[:], body)
	text := string(sc.enc[:b64.EncodedLen(len(body))])
	l.keys.signing.put(p, sc)
	return st, text, nil
}

// verifyStamp parses s as a stamp of version ver and checks its MAC for
// subject and its expiry against now; lifetime is the limiter's lifetime for
// this kind, which bounds how far in the future an expiry may lie. It
// returns the stamp and one of the ErrToken* sentinels.
func (l *Limiter) verifyStamp(p purpose, ver byte, plen int, s, subject string, now time.Time, lifetime time.Duration) (stamp, error) {
	var st stamp
	sc := l.keys.signing.get(p)
	defer l.keys.signing.put(p, sc)
	bodyLen, err := parseStamp(&st, sc.raw[:], sc.enc[:], s, ver, plen)
	if err != nil {
		return st, err
	}
	vsc := sc
	if st.kid != l.keys.signing.id {
		other := l.keys.byID[st.kid]
		if other == nil {
			return st, ErrTokenUnknownKey
		}
		vsc = other.get(p)
		defer other.put(p, vsc)
	}
	if !vsc.verify(st.mac[:], sc.raw[:bodyLen], l.name, subject) {
		return st, ErrTokenInvalid
	}
	nowMs := now.UnixMilli()
	if nowMs >= st.expires {
		return st, ErrTokenExpired
	}
	if st.expires-nowMs > lifetime.Milliseconds()+l.maxSkew.Milliseconds() {
		return st, ErrTokenFuture
	}
	return st, nil
}
