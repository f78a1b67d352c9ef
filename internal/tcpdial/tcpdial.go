// Package tcpdial builds the TCP dialer that redisstore's and pgstore's
// serverless settings share: keepalive probes on idle connections, and on
// Linux TCP_USER_TIMEOUT, so that a connection whose peer stopped answering
// is closed by the kernel instead of looking open for the kernel's default
// retransmission time (about 15 minutes).
package tcpdial

import (
	"net"
	"strings"
	"syscall"
	"time"
)

// Keepalive and TCP_USER_TIMEOUT settings of the dialer New returns.
//
// Idle is well below the idle limits of NAT gateways and load balancers
// (AWS NAT gateway and NLB 350 s, Azure load balancer 4 min), so that a
// connection of a running process keeps its flow alive. UserTimeout is how
// long sent data or a keepalive probe may go unacknowledged before Linux
// closes the connection (TCP_USER_TIMEOUT, RFC 5482); it also caps the
// keepalive probe count.
const (
	Idle        = 30 * time.Second
	Interval    = 5 * time.Second
	Count       = 3
	UserTimeout = 15 * time.Second
)

// New returns a dialer with the given connect timeout (0 means none), TCP
// keepalive (Idle, Interval, Count) and, on Linux and for TCP only,
// TCP_USER_TIMEOUT set to UserTimeout.
func New(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout:         timeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: Idle, Interval: Interval, Count: Count},
		Control:         control,
	}
}

func control(network, _ string, c syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return nil
	}
	var serr error
	if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, UserTimeout) }); err != nil {
		return err
	}
	return serr
}
