package ratekit_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/signedwindow"
)

// The refund recipe of RequestFromContext end to end behind Middleware,
// with a strategy whose state the client carries (signedwindow without a
// replay cache): a handler whose work fails refunds the request from the
// context and sends the refund's state back; alternating failed and
// successful calls then admit exactly Limit successful ones.
func TestRefundRecipeThroughMiddleware(t *testing.T) {
	const limit = 3
	l, err := signedwindow.New(signedwindow.Config{
		Name: "paid", Quota: limit, Window: time.Hour,
		Keys: []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{7}, signedwindow.MinSecretLen)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: httplimit.GuardConfig{Limiter: l, OnError: httplimit.FailClosed, NoStateCookie: true},
		Key:         httplimit.RemoteAddrKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/fail" {
			return
		}
		charged, ok := httplimit.RequestFromContext(r.Context())
		if !ok {
			t.Error("no charged request in the context")
			return
		}
		d, err := l.Refund(r.Context(), charged)
		if err != nil {
			t.Error(err)
			return
		}
		w.Header().Set(httplimit.DefaultStateHeader, d.State)
		w.WriteHeader(http.StatusBadGateway)
	}))
	token, kept := "", 0
	for i := 0; i < 4*limit; i++ {
		path := "/ok"
		if i%2 == 1 {
			path = "/fail"
		}
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = "198.51.100.1:1000"
		if token != "" {
			r.Header.Set(httplimit.DefaultStateHeader, token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if tok := w.Header().Get(httplimit.DefaultStateHeader); tok != "" {
			token = tok
		}
		if w.Code == http.StatusTooManyRequests {
			break
		}
		if w.Code == http.StatusOK {
			kept++
		}
	}
	if kept != limit {
		t.Fatalf("alternating failed and successful calls: %d successful calls admitted on a limit of %d", kept, limit)
	}
}
