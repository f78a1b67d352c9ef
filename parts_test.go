package ratekit_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestValidateParts(t *testing.T) {
	long := strings.Repeat("k", ratekit.MaxKeyLen+1)
	tests := []struct {
		name  string
		parts []ratekit.Part
		want  error
	}{
		{"none", nil, nil},
		{"two", []ratekit.Part{{Key: "user:1", Cost: 1}, {Key: "org:7", Cost: 40}}, nil},
		{"empty key", []ratekit.Part{{Key: "user:1", Cost: 1}, {Key: "", Cost: 1}}, ratekit.ErrEmptyKey},
		{"long key", []ratekit.Part{{Key: long, Cost: 1}}, ratekit.ErrKeyTooLong},
		{"zero cost", []ratekit.Part{{Key: "a", Cost: 0}}, ratekit.ErrInvalidCost},
		{"negative cost", []ratekit.Part{{Key: "a", Cost: -1 << 63}}, ratekit.ErrInvalidCost},
	}
	for _, tc := range tests {
		err := ratekit.Request{Key: "subject", Cost: 1, Parts: tc.parts}.Validate()
		if tc.want == nil && err != nil || tc.want != nil && (!errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest)) {
			t.Errorf("%s: Validate = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestSinglePolicyRefusesParts: a limiter of one policy never drops the
// parts of a composite request on the floor.
func TestSinglePolicyRefusesParts(t *testing.T) {
	sw, err := signedwindow.New(signedwindow.Config{
		Name: "form", Quota: 5, Window: time.Minute,
		Keys: []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{7}, 32)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	store, err := memstore.New(memstore.Config{MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := tokenbucket.New(tokenbucket.Config{
		Name: "api", Burst: 5, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	req := ratekit.Request{Key: "user:1", Cost: 1, Parts: []ratekit.Part{{Key: "user:1", Cost: 1}, {Key: "org:7", Cost: 1}}}
	for name, l := range map[string]ratekit.Limiter{"signedwindow": sw, "tokenbucket": tb} {
		if _, err := l.Allow(context.Background(), req); !errors.Is(err, ratekit.ErrUnexpectedParts) || !errors.Is(err, ratekit.ErrInvalidRequest) {
			t.Errorf("%s: Allow with parts: %v, want ErrUnexpectedParts", name, err)
		}
		if _, err := l.(ratekit.Peeker).Peek(context.Background(), req); !errors.Is(err, ratekit.ErrUnexpectedParts) {
			t.Errorf("%s: Peek with parts: %v, want ErrUnexpectedParts", name, err)
		}
		if _, err := l.(ratekit.Refunder).Refund(context.Background(), req); !errors.Is(err, ratekit.ErrUnexpectedParts) {
			t.Errorf("%s: Refund with parts: %v, want ErrUnexpectedParts", name, err)
		}
	}
}
