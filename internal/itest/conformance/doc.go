// Package conformance runs the limitertest suite against every ratekit
// strategy and store: signedwindow, tokenbucket on memory and on Redis in
// both modes, and durable on PostgreSQL directly and through PgBouncer with
// every algorithm. It has tests only.
package conformance
