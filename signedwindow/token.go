package signedwindow

import (
	"encoding/binary"
	"time"
)

// Format limits of a version 1 token. Values outside them are malformed.
const (
	tokenV1 = 0x01

	// maxUnixSeconds bounds window starts (year 36812), so that time
	// arithmetic on a verified token cannot overflow.
	maxUnixSeconds = 1<<40 - 1

	// maxTTLSeconds bounds the expiry offset from the window start.
	maxTTLSeconds = 1<<32 - 1

	minTokenLen = 1 + 1 + 3 + macLen         // three one-byte varints
	maxTokenLen = 1 + 1 + 6 + 9 + 5 + macLen // widest start, count, offset
)

// Token is a parsed window token: the state a client carries between
// requests. Obtain one with [ParseToken] (structure only) or
// [Limiter.VerifyToken] (structure, signature and time).
type Token struct {
	// KeyID is the ID of the [Key] that signed the token.
	KeyID uint8

	// WindowStart is the start of the token's window, in whole seconds.
	WindowStart time.Time

	// Count is the number of units used in the window.
	Count int64

	// Expires is when the token stops being accepted, in whole seconds:
	// the end of the window by the configuration that issued it.
	Expires time.Time

	mac [macLen]byte
}

// tokenFields is the parsed form the hot path works with.
type tokenFields struct {
	kid   uint8
	start int64 // Unix seconds
	count int64
	ttl   int64 // seconds from start to expiry
	mac   [macLen]byte
}

// ParseToken parses the text of a version 1 token and checks its structure
// only: the signature and the times are not checked (use
// [Limiter.VerifyToken] for that). It returns an error matching
// [ErrTokenMissing] for an empty string, [ErrTokenUnknownVersion] for
// another version, and [ErrTokenMalformed] for anything else that is not
// the one accepted encoding of a token. A parsed token's String method
// returns s exactly.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, ErrTokenMissing
	}
	var raw [maxRawLen]byte
	var src [maxEncLen]byte
	n, ok := decodeStrict(raw[:], src[:], s, maxRawLen)
	if !ok {
		return Token{}, ErrTokenMalformed
	}
	tf, _, err := parseToken(raw[:n])
	if err != nil {
		return Token{}, err
	}
	return tf.token(), nil
}

// String returns the token's text, the form clients carry. For a Token
// obtained from ParseToken or Limiter.VerifyToken it is the text that was
// parsed; for a Token built by hand it carries no valid signature.
func (t Token) String() string {
	tf := tokenFields{
		kid:   t.KeyID,
		start: t.WindowStart.Unix(),
		count: t.Count,
		ttl:   t.Expires.Unix() - t.WindowStart.Unix(),
		mac:   t.mac,
	}
	var raw [maxRawLen]byte
	body := tf.appendBody(raw[:0])
	body = append(body, tf.mac[:]...)
	var enc [maxEncLen]byte
	n := b64.EncodedLen(len(body))
	b64.Encode(enc[:], body)
	return string(enc[:n])
}

func (tf *tokenFields) token() Token {
	return Token{
		KeyID:       tf.kid,
		WindowStart: time.Unix(tf.start, 0),
		Count:       tf.count,
		Expires:     time.Unix(tf.start+tf.ttl, 0),
		mac:         tf.mac,
	}
}

// appendBody appends the signed fields of the token (everything but the MAC).
func (tf *tokenFields) appendBody(b []byte) []byte {
	b = append(b, tokenV1, tf.kid)
	b = binary.AppendUvarint(b, uint64(tf.start))
	b = binary.AppendUvarint(b, uint64(tf.count))
	b = binary.AppendUvarint(b, uint64(tf.ttl))
	return b
}

// parseToken parses decoded token bytes and returns the fields and the
// length of the signed body.
func parseToken(raw []byte) (tokenFields, int, error) {
	var tf tokenFields
	if len(raw) < 2 {
		return tf, 0, ErrTokenMalformed
	}
	if raw[0] != tokenV1 {
		return tf, 0, ErrTokenUnknownVersion
	}
	if len(raw) < minTokenLen || len(raw) > maxTokenLen {
		return tf, 0, ErrTokenMalformed
	}
	tf.kid = raw[1]
	bodyLen := len(raw) - macLen
	i := 2
	var n int
	if tf.start, n = readUvarint(raw[i:bodyLen]); n == 0 || tf.start > maxUnixSeconds {
		return tf, 0, ErrTokenMalformed
	}
	i += n
	if tf.count, n = readUvarint(raw[i:bodyLen]); n == 0 {
		return tf, 0, ErrTokenMalformed
	}
	i += n
	if tf.ttl, n = readUvarint(raw[i:bodyLen]); n == 0 || tf.ttl > maxTTLSeconds {
		return tf, 0, ErrTokenMalformed
	}
	i += n
	if i != bodyLen {
		return tf, 0, ErrTokenMalformed
	}
	copy(tf.mac[:], raw[bodyLen:])
	return tf, bodyLen, nil
}
