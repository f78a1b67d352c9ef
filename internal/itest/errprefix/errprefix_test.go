package errprefix_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestConfigErrorPrefix(t *testing.T) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pkg string
		new func() error
	}{
		{"signedwindow", func() error { _, err := signedwindow.New(signedwindow.Config{}); return err }},
		{"signedwindow", func() error {
			_, err := signedwindow.New(signedwindow.Config{Name: "p", Quota: 0})
			return err
		}},
		{"tokenbucket", func() error { _, err := tokenbucket.New(tokenbucket.Config{}); return err }},
		{"tokenbucket", func() error {
			_, err := tokenbucket.New(tokenbucket.Config{Name: "p", Store: store})
			return err
		}},
		{"durable", func() error { _, err := durable.New(durable.Config{}); return err }},
		{"memstore", func() error { _, err := memstore.New(memstore.Config{MaxKeys: -1}); return err }},
		{"redisstore", func() error { _, err := redisstore.New(nil, redisstore.Config{}); return err }},
		{"pgstore", func() error { _, err := pgstore.New(nil, pgstore.Config{}); return err }},
		{"breaker", func() error { _, err := breaker.New(nil, breaker.Config{}); return err }},
		{"lambda", func() error { _, err := lambda.New(lambda.Config{}); return err }},
	} {
		err := tc.new()
		if !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want an ErrInvalidConfig", tc.pkg, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.pkg+": ") {
			t.Errorf("%s: %q does not start with %q", tc.pkg, err, tc.pkg+": ")
		}
	}
}
