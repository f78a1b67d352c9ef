package signedwindow

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/ratekit/ratekit"
)

// macLen is the length of every MAC this package writes: HMAC-SHA256
// truncated to 128 bits (RFC 2104, section 5, allows truncation to no less
// than half the hash output).
const macLen = 16

// purpose separates the kinds of signed values: each has its own derived key.
type purpose uint8

const (
	purposeToken purpose = iota
	purposeNonce
	purposeChallenge
	numPurposes
)

var purposeNames = [numPurposes]string{"token", "nonce", "challenge"}

// hkdfSalt is the fixed, public HKDF salt (RFC 5869, section 3.1).
var hkdfSalt = []byte("github.com/ratekit/ratekit/signedwindow")

// b64 decodes strictly: non-zero trailing bits are refused. Line breaks are
// still skipped by encoding/base64, so decodeStrict also checks the length.
var b64 = base64.RawURLEncoding.Strict()

// Sizes of the scratch buffers. A MAC input holds the body of a value, the
// policy name and the subject, each after a varint length of at most 2
// bytes, after a one-byte count.
const (
	maxRawLen = 64 // longest decoded value of any kind
	maxEncLen = 86 // base64url of maxRawLen bytes
	maxMsgLen = 1 + 3*2 + maxRawLen + ratekit.MaxPolicyNameLen + ratekit.MaxKeyLen
)

// scratch is the per-call working memory of a signing or verifying
// operation. It is pooled together with a keyed HMAC so that the hot path
// allocates nothing but the returned string.
type scratch struct {
	h   hash.Hash // HMAC-SHA256 keyed with one derived key
	raw [maxRawLen]byte
	enc [maxEncLen]byte
	msg [maxMsgLen]byte
	sum [sha256.Size]byte
}

// signer holds the derived keys of one Key, one pool of keyed HMACs per
// purpose.
type signer struct {
	id    uint8
	pools [numPurposes]sync.Pool
}

func newSigner(k Key, policy string) (*signer, error) {
	s := &signer{id: k.ID}
	for p := range numPurposes {
		info := "ratekit/signedwindow/v1/" + purposeNames[p] + "/" + policy
		derived, err := hkdf.Key(sha256.New, k.Secret, hkdfSalt, info, sha256.Size)
		if err != nil {
			return nil, err
		}
		s.pools[p].New = func() any {
			return &scratch{h: hmac.New(sha256.New, derived)}
		}
	}
	return s, nil
}

func (s *signer) get(p purpose) *scratch { return s.pools[p].Get().(*scratch) }

func (s *signer) put(p purpose, sc *scratch) { s.pools[p].Put(sc) }

// mac computes the truncated HMAC of PAE(body, policy, subject) into out.
// body may alias sc.raw or sc.enc but not sc.msg.
//
// PAE is the pre-authentication encoding of PASETO: the number of pieces,
// then each piece preceded by its length, so that the MAC input is
// unambiguous whatever the pieces contain. PASETO writes the integers as
// 64-bit words; this package writes them as unsigned varints, which are just
// as self-delimiting, so that a typical input (a 12-byte policy name, an
// IPv4 subject) fits in one SHA-256 block.
func (sc *scratch) mac(out *[macLen]byte, body []byte, policy, subject string) {
	m := append(sc.msg[:0], 3)
	m = binary.AppendUvarint(m, uint64(len(body)))
	m = append(m, body...)
	m = binary.AppendUvarint(m, uint64(len(policy)))
	m = append(m, policy...)
	m = binary.AppendUvarint(m, uint64(len(subject)))
	m = append(m, subject...)
	sc.h.Reset()
	sc.h.Write(m)
	sc.h.Sum(sc.sum[:0])
	copy(out[:], sc.sum[:macLen])
}

// verify reports whether mac is the MAC of body for policy and subject,
// comparing in constant time.
func (sc *scratch) verify(mac []byte, body []byte, policy, subject string) bool {
	var want [macLen]byte
	sc.mac(&want, body, policy, subject)
	return hmac.Equal(want[:], mac)
}

// keyring maps key IDs to signers; signing uses Keys[0].
type keyring struct {
	signing *signer
	byID    [256]*signer
}

func newKeyring(keys []Key, policy string) (*keyring, error) {
	kr := &keyring{}
	for i, k := range keys {
		s, err := newSigner(k, policy)
		if err != nil {
			return nil, err
		}
		kr.byID[k.ID] = s
		if i == 0 {
			kr.signing = s
		}
	}
	return kr, nil
}

// decodeStrict decodes the base64url text s into dst and returns the
// decoded length. It refuses text longer than max decoded bytes, padding,
// characters outside the URL alphabet, non-zero trailing bits and line
// breaks, so each byte string has exactly one accepted text.
func decodeStrict(dst []byte, src []byte, s string, max int) (int, bool) {
	if len(s) > base64.RawURLEncoding.EncodedLen(max) || len(s) > len(src) {
		return 0, false
	}
	n := copy(src, s)
	d, err := b64.Decode(dst, src[:n])
	if err != nil || base64.RawURLEncoding.EncodedLen(d) != len(s) {
		return 0, false
	}
	return d, true
}

// readUvarint reads a minimally encoded unsigned varint no larger than
// math.MaxInt64 from b, returning the value and the bytes read (0 on error).
func readUvarint(b []byte) (int64, int) {
	v, n := binary.Uvarint(b)
	if n <= 0 || (n > 1 && b[n-1] == 0) || v > 1<<63-1 {
		return 0, 0
	}
	return int64(v), n
}
