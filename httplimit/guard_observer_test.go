package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"testing"

	"github.com/ratekit/ratekit"
)

func TestGuardObserverFailurePolicy(t *testing.T) {
	storeErr := errors.New("store down")
	fbErr := errors.New("fallback down")
	fallback := newWindowLimiter("fb", 5)
	tests := []struct {
		name     string
		cfg      GuardConfig
		req      ratekit.Request
		want     []ratekit.FailureEvent
		wantCode int
	}{
		{
			name:     "fail open",
			cfg:      GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5), err: storeErr}, OnError: FailOpen},
			want:     []ratekit.FailureEvent{{Policy: "api", Action: ratekit.FailedOpen, ErrorClass: ratekit.ErrorStore, Err: storeErr}},
			wantCode: 0,
		},
		{
			name:     "fail closed",
			cfg:      GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5), err: storeErr}, OnError: FailClosed},
			want:     []ratekit.FailureEvent{{Policy: "api", Action: ratekit.FailedClosed, ErrorClass: ratekit.ErrorStore, Err: storeErr}},
			wantCode: http.StatusServiceUnavailable,
		},
		{
			name:     "fallback decides",
			cfg:      GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5), err: storeErr}, OnError: UseFallback, Fallback: fallback},
			want:     []ratekit.FailureEvent{{Policy: "api", Action: ratekit.FellBack, ErrorClass: ratekit.ErrorStore, Err: storeErr}},
			wantCode: 0,
		},
		{
			name: "fallback fails too",
			cfg: GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5), err: storeErr}, OnError: UseFallback,
				Fallback: failingLimiter{err: fbErr}},
			want:     []ratekit.FailureEvent{{Policy: "api", Action: ratekit.FailedClosed, ErrorClass: ratekit.ErrorStore, Err: storeErr, FallbackErr: fbErr}},
			wantCode: http.StatusServiceUnavailable,
		},
		{
			name: "observed limiter reports its policy",
			cfg: GuardConfig{Limiter: ratekit.Observe(&policyLimiter{windowLimiter: newWindowLimiter("api", 5), err: storeErr},
				&ratekit.Observer{Decision: func(context.Context, ratekit.DecisionEvent) {}}), OnError: FailOpen},
			want: []ratekit.FailureEvent{{Policy: "api", Action: ratekit.FailedOpen, ErrorClass: ratekit.ErrorStore, Err: storeErr}},
		},
		{
			name:     "invalid request is no failure",
			cfg:      GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5)}, OnError: FailOpen},
			req:      ratekit.Request{Key: "k", Cost: 6},
			wantCode: http.StatusBadRequest,
		},
		{
			name: "decision is no failure",
			cfg:  GuardConfig{Limiter: &policyLimiter{windowLimiter: newWindowLimiter("api", 5)}, OnError: FailClosed},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log eventLog
			tt.cfg.Observer = log.observer()
			tt.cfg.Logger = slog.New(slog.DiscardHandler)
			g, err := NewGuard(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := tt.req
			if req.Key == "" {
				req = ratekit.Request{Key: "k", Cost: 1}
			}
			res := g.Check(context.Background(), req, http.Header{})
			if res.Status != tt.wantCode {
				t.Fatalf("status %d, want %d", res.Status, tt.wantCode)
			}
			if !reflect.DeepEqual(log.failures, tt.want) {
				t.Fatalf("failure events\n%+v\nwant\n%+v", log.failures, tt.want)
			}
			if len(log.events) != 0 {
				t.Fatalf("guard reported %d decisions itself, want 0 (Observe does)", len(log.events))
			}
		})
	}
}
