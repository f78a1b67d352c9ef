// Package pgengine is the engine behind pgstore and durable: the PostgreSQL
// schema and its decision functions, the counters that call them one
// round trip per decision, composites over several counters, and the
// coalescing of concurrent decisions into one statement. Package pgstore's
// documentation describes what it guarantees.
//
// Users never name this package. pgstore.New builds a [Store] and hands it
// out inside a *pgstore.Store, which embeds a [Handle]; package durable
// reads it back with [From]. The Handle's only method is unexported, so no
// other package can read or forge one, and nothing is registered at
// package initialisation or at run time.
//
// The package imports neither pgstore nor durable: both import it.
package pgengine
