//go:build !linux

package tcpdial

import "time"

// setUserTimeout does nothing outside Linux, which alone has
// TCP_USER_TIMEOUT under that name; keepalive still applies.
func setUserTimeout(uintptr, time.Duration) error { return nil }

func userTimeout(uintptr) (time.Duration, error) { return 0, nil }
