package signedwindow

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"testing"
	"time"
)

// TestTokenFormat rebuilds a token from the format described in the package
// documentation, with the standard library only, and compares it with what
// the limiter issues: HKDF-SHA256 key derivation, PAE with varint lengths,
// HMAC-SHA256 truncated to 16 bytes, unpadded base64url.
func TestTokenFormat(t *testing.T) {
	clock := newClock(time.Unix(1_795_000_000, 0))
	l := mustNew(t, testConfig(clock))
	d := allow(t, l, alice, "")

	key, err := hkdf.Key(sha256.New, secret(1), []byte("github.com/ratekit/ratekit/signedwindow"),
		"ratekit/signedwindow/v1/token/contact-form", 32)
	if err != nil {
		t.Fatal(err)
	}
	// version 1, key 1, start 1795000000 (uvarint), count 1, expiry 60 s.
	body := binary.AppendUvarint([]byte{0x01, 0x01}, 1_795_000_000)
	body = append(body, 0x01, 0x3c)
	var msg []byte
	msg = append(msg, 3)
	msg = append(msg, byte(len(body)))
	msg = append(msg, body...)
	msg = append(msg, byte(len("contact-form")))
	msg = append(msg, "contact-form"...)
	msg = append(msg, byte(len(alice)))
	msg = append(msg, alice...)
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	want := base64.RawURLEncoding.EncodeToString(append(body, m.Sum(nil)[:16]...))
	if d.State != want {
		t.Fatalf("token = %q, want %q", d.State, want)
	}
	// Every kind of value has its own key.
	seen := map[string]bool{}
	for p := range numPurposes {
		sc := l.keys.signing.get(p)
		var mac [macLen]byte
		sc.mac(&mac, body, l.name, alice)
		l.keys.signing.put(p, sc)
		if seen[string(mac[:])] {
			t.Fatalf("purpose %d shares a MAC key", p)
		}
		seen[string(mac[:])] = true
	}
}

// TestPAEUnambiguous checks that moving bytes between pieces changes the
// MAC input.
func TestPAEUnambiguous(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	sc := l.keys.signing.get(purposeToken)
	defer l.keys.signing.put(purposeToken, sc)
	var a, b [macLen]byte
	sc.mac(&a, []byte("ab"), "c", "d")
	sc.mac(&b, []byte("a"), "bc", "d")
	if bytes.Equal(a[:], b[:]) {
		t.Fatal("PAE is ambiguous")
	}
	sc.mac(&b, []byte("ab"), "c", "d")
	if !bytes.Equal(a[:], b[:]) {
		t.Fatal("MAC is not deterministic")
	}
}
