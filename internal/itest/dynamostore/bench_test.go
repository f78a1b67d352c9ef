// Package dynamostore_test compares dynamostore with the other exact
// stores; it lives here so that dynamostore's module requires neither
// go-redis nor pgx.
package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchmarkAllow compares one exact token-bucket decision (cost 1, on 1,024
// keys, never denied) over dynamostore on the test DynamoDB (dynalite on
// loopback unless RATEKIT_DYNAMODB_ENDPOINT names another), over
// redisstore and over durable's PostgreSQL token bucket, at 1 and 8
// goroutines per CPU. Besides ns/op it reports decisions/s and the p50 and
// p99 latency of one decision in microseconds.
func BenchmarkAllow(b *testing.B) {
	const burst = 1 << 25 // never denies; at most one unit per 100µs of the hour, as durable requires
	subjects := []struct {
		name string
		new  func(b *testing.B) ratekit.Limiter
	}{
		{"dynamodb", func(b *testing.B) ratekit.Limiter {
			store := dynamoStore(b)
			return newLimiter(b, tokenbucket.Config{Name: "bench", Burst: burst, RefillRate: tokenbucket.PerHour(burst), Mode: tokenbucket.Atomic, Store: store})
		}},
		{"redis", func(b *testing.B) ratekit.Limiter {
			c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{testenv.RedisAddr(b)}, PoolSize: 64})
			p := fmt.Sprintf("ratekit-bench:dynamostore:%d:", time.Now().UnixNano())
			redisclient.DeleteAtCleanup(b, c, p)
			store, err := redisstore.New(c, redisstore.Config{Prefix: p})
			if err != nil {
				b.Fatal(err)
			}
			return newLimiter(b, tokenbucket.Config{Name: "bench", Burst: burst, RefillRate: tokenbucket.PerHour(burst), Mode: tokenbucket.Atomic, Store: store})
		}},
		{"postgres", func(b *testing.B) ratekit.Limiter {
			pool := pgstoretest.Pool(b, pgstoretest.PostgresURL(b), 16, "")
			schema := pgstoretest.NewSchema()
			b.Cleanup(func() { pgstoretest.Drop(schema) })
			store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Migrate(context.Background()); err != nil {
				b.Fatal(err)
			}
			l, err := durable.New(durable.Config{Store: store, Policy: ratekit.Policy{Name: "bench", Quota: burst, Window: time.Hour, Algorithm: ratekit.TokenBucket}, Prefix: "bench", Durability: durable.Unlogged})
			if err != nil {
				b.Fatal(err)
			}
			return l
		}},
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	for _, s := range subjects {
		for _, par := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/parallelism=%d", s.name, par), func(b *testing.B) {
				l := s.new(b)
				ctx := context.Background()
				var mu sync.Mutex
				var all []time.Duration
				var next int
				b.SetParallelism(par)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					mu.Lock()
					k := next
					next++
					mu.Unlock()
					lat := make([]time.Duration, 0, 1024)
					for pb.Next() {
						t0 := time.Now()
						if _, err := l.Allow(ctx, ratekit.Request{Key: keys[k%len(keys)], Cost: 1}); err != nil {
							b.Error(err)
							return
						}
						lat = append(lat, time.Since(t0))
						k += 7
					}
					mu.Lock()
					all = append(all, lat...)
					mu.Unlock()
				})
				elapsed := time.Since(start)
				b.StopTimer()
				if len(all) == 0 {
					return
				}
				slices.Sort(all)
				b.ReportMetric(float64(len(all))/elapsed.Seconds(), "decisions/s")
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

// dynamoStore returns a Store on a table of its own, created on the test
// DynamoDB and deleted at cleanup. Connections are kept, as in production.
func dynamoStore(b *testing.B) *dynamostore.Store {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	b.Cleanup(tr.CloseIdleConnections)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(testenv.DynamoDBEndpoint(b)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ratekit benchmark"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	})
	ctx := context.Background()
	table := fmt.Sprintf("ratekit-bench-%d", time.Now().UnixNano())
	// dynalite has no Time to Live; the Store checks expiry itself.
	if err := dynamostore.CreateTable(ctx, client, table); err != nil && !errors.Is(err, dynamostore.ErrNoTTL) {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	s, err := dynamostore.New(client, dynamostore.Config{Table: table, Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func newLimiter(b *testing.B, cfg tokenbucket.Config) *tokenbucket.Limiter {
	l, err := tokenbucket.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return l
}
