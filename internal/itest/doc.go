// Package itest is ratekit's test-only module. Its subdirectories hold the
// tests that need more than the module of the package under test requires:
// the Redis tests of tokenbucket and breaker (go-redis), the fault and thaw
// tests of the stores (toxiproxy and a relay that goes silent), the OpenTelemetry
// SDK tests of otelratekit, and the checks that span every strategy and
// module: conformance, histories, linearizability (linearize), header
// parsing (headers), the x/time/rate reference (reference), plans and
// calendar periods decided by several processes (plans), the error
// prefix rule (errprefix), the release as a user installs it (release) and
// the README's quick start run as written (quickstart). No library module
// requires it.
package itest
