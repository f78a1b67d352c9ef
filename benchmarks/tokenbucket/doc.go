// Package tokenbucket compares ratekit's tokenbucket with its peers.
//
// The Go benchmarks in this package put the in-memory decision beside
// golang.org/x/time/rate with one limiter per key and
// sethvargo/go-limiter's memorystore; BenchmarkMemoryInTurn runs them in
// turn, in chunks, which a loaded machine disturbs least:
//
//	cd benchmarks && go test -run '^$' -bench . -count 5 ./tokenbucket/
//	cd benchmarks && go test -run '^$' -bench MemoryInTurn -benchtime 100x ./tokenbucket/
//
// BenchmarkRedis gives allocations per Redis decision; latency percentiles,
// the other peers and the floors come from the compare program:
//
//	cd benchmarks && go run ./compare -backends redis
package tokenbucket
