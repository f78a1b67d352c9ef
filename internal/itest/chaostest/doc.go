// Package chaostest injects latency, connection resets and outages between
// ratekit's limiters and PostgreSQL or Redis with an in-process TCP fault
// proxy (toxiproxy), and checks each failure policy of httplimit.Guard, with
// and without the circuit breaker. It has tests only.
package chaostest
