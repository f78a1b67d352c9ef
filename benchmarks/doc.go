// Package benchmarks compares ratekit with its peers on the same machine in
// the same run. It is a separate module so that the peers' dependencies never
// enter ratekit's own go.mod.
package benchmarks
