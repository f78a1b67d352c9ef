package ratekit

import (
	"errors"
	"fmt"
	"testing"
)

// TestInvalidRequestErrors checks the sentinel errors laid out statically:
// each matches ErrInvalidRequest and reads as the wrapping it replaces.
func TestInvalidRequestErrors(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{ErrEmptyKey, "empty key"},
		{ErrKeyTooLong, fmt.Sprintf("key longer than %d bytes", MaxKeyLen)},
		{ErrInvalidCost, "cost must be at least 1"},
		{ErrCostExceedsQuota, "cost exceeds the quota"},
	} {
		if !errors.Is(tt.err, ErrInvalidRequest) || errors.Is(tt.err, ErrInvalidConfig) {
			t.Errorf("%v: errors.Is ErrInvalidRequest %v, ErrInvalidConfig %v", tt.err, errors.Is(tt.err, ErrInvalidRequest), errors.Is(tt.err, ErrInvalidConfig))
		}
		if want := fmt.Errorf("%w: %s", ErrInvalidRequest, tt.want).Error(); tt.err.Error() != want {
			t.Errorf("error text %q, want %q", tt.err.Error(), want)
		}
	}
}
