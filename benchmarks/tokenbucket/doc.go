// Package tokenbucket compares ratekit's tokenbucket with its peers.
//
// The Go benchmarks in this package put the in-memory decision beside
// golang.org/x/time/rate with one limiter per key:
//
//	cd benchmarks && go test -run '^$' -bench . -count 5 ./tokenbucket/
//
// The program in rediscompare puts the atomic Redis decision beside
// github.com/go-redis/redis_rate/v10 and a bare INCR round trip and prints a
// markdown table:
//
//	cd benchmarks && go run ./tokenbucket/rediscompare -runs 5
package tokenbucket
