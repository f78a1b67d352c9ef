// Package tokenbucket compares ratekit's tokenbucket with its peers.
//
// The Go benchmarks in this package put the in-memory decision beside
// golang.org/x/time/rate with one limiter per key:
//
//	cd benchmarks && go test -run '^$' -bench . -count 5 ./tokenbucket/
//
// BenchmarkRedis gives allocations per Redis decision; latency percentiles,
// the other peers and the floors come from the compare program:
//
//	cd benchmarks && go run ./compare -backends redis
package tokenbucket
