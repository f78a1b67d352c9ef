package httplimit

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratekit/ratekit"
)

func TestRemoteAddrKey(t *testing.T) {
	key := RemoteAddrKey()
	tests := []struct {
		remote, want string
		err          error
	}{
		{"203.0.113.7:51234", "ip:203.0.113.7", nil},
		{"203.0.113.7", "ip:203.0.113.7", nil}, // lambdaurl: no port
		{"[2001:db8:1:2:3:4:5:6]:443", "ip:2001:db8:1:2::/64", nil},
		{"2001:db8:1:2:ffff::1", "ip:2001:db8:1:2::/64", nil},
		{"[::ffff:198.51.100.1]:80", "ip:198.51.100.1", nil},
		{"[fe80::1%eth0]:80", "ip:fe80::/64", nil},
		{"", "", ErrNoKey},
		{"not-an-ip:80", "", ErrNoKey},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tt.remote
		got, err := key(r)
		if got != tt.want || !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
			t.Errorf("RemoteAddrKey(%q) = %q, %v; want %q, %v", tt.remote, got, err, tt.want, tt.err)
		}
	}
}

func TestForwardedForKey(t *testing.T) {
	tests := []struct {
		name    string
		trusted int
		fields  []string
		want    string
		err     error
	}{
		{"one proxy appends the client", 1, []string{"198.51.100.9"}, "ip:198.51.100.9", nil},
		{"client-written entries on the left are ignored", 1, []string{"1.2.3.4, 5.6.7.8, 198.51.100.9"}, "ip:198.51.100.9", nil},
		{"two proxies: second from the right", 2, []string{"1.2.3.4, 198.51.100.9, 10.0.0.2"}, "ip:198.51.100.9", nil},
		{"split over several fields", 2, []string{"1.2.3.4", "198.51.100.9", "10.0.0.2"}, "ip:198.51.100.9", nil},
		{"split mid-list", 3, []string{"1.2.3.4, 198.51.100.9", "10.0.0.3, 10.0.0.2"}, "ip:198.51.100.9", nil},
		{"spaces and IPv6", 1, []string{" 2001:db8::1 "}, "ip:2001:db8::/64", nil},
		{"too few entries (spoof-proof: no fallback to the left)", 3, []string{"1.2.3.4, 10.0.0.2"}, "", ErrNoKey},
		{"no field", 1, nil, "", ErrNoKey},
		{"garbage where the client should be", 1, []string{"198.51.100.9, unknown"}, "", ErrNoKey},
		{"empty trailing entry", 1, []string{"198.51.100.9,"}, "", ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := ForwardedForKey(tt.trusted)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			for _, f := range tt.fields {
				r.Header.Add("X-Forwarded-For", f)
			}
			got, err := key(r)
			if got != tt.want || !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
				t.Fatalf("key = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
		})
	}
	if _, err := ForwardedForKey(0); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("ForwardedForKey(0) error = %v, want ErrInvalidConfig", err)
	}
}

func TestHeaderIPKey(t *testing.T) {
	key, err := HeaderIPKey("fly-client-ip")
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	if _, err := key(r); !errors.Is(err, ErrNoKey) {
		t.Fatalf("missing field: %v, want ErrNoKey", err)
	}
	r.Header.Set("Fly-Client-IP", "198.51.100.9")
	if got, err := key(r); got != "ip:198.51.100.9" || err != nil {
		t.Fatalf("key = %q, %v", got, err)
	}
	r.Header.Add("Fly-Client-IP", "1.2.3.4")
	if _, err := key(r); !errors.Is(err, ErrNoKey) {
		t.Fatalf("repeated field: %v, want ErrNoKey", err)
	}
	if _, err := HeaderIPKey("bad name"); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("bad field name: %v, want ErrInvalidConfig", err)
	}
}

func TestAPIKeyHeaderKey(t *testing.T) {
	key, err := APIKeyHeaderKey("Authorization")
	if err != nil {
		t.Fatal(err)
	}
	get := func(v string) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		if v != "" {
			r.Header.Set("Authorization", v)
		}
		return key(r)
	}
	a, err := get("Bearer secret-1")
	if err != nil || !strings.HasPrefix(a, "key:") || len(a) != 4+32 || strings.Contains(a, "secret") {
		t.Fatalf("key = %q, %v", a, err)
	}
	if b, _ := get("secret-1"); b != a {
		t.Fatalf("bearer prefix not stripped: %q vs %q", b, a)
	}
	if c, _ := get("Bearer secret-2"); c == a {
		t.Fatal("different API keys share a rate-limit key")
	}
	for _, empty := range []string{"", "Bearer ", "   "} {
		if _, err := get(empty); !errors.Is(err, ErrNoKey) {
			t.Fatalf("get(%q) error = %v, want ErrNoKey", empty, err)
		}
	}
	if _, err := APIKeyHeaderKey(""); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("empty field name: %v, want ErrInvalidConfig", err)
	}
}
