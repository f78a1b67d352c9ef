// Package pgengine is the engine behind pgstore and durable: the PostgreSQL
// schema and its decision functions, the counters that call them one
// round trip per decision, composites over several counters, and the
// coalescing of concurrent decisions into one statement. Package pgstore's
// documentation describes what it guarantees.
//
// Users never name this package. pgstore.Store is defined as this
// package's [Store] (type Store pgengine.Store), so pgstore.New returns the
// engine under pgstore's name and package durable converts it back; the
// defined type has none of the engine's methods.
//
// The package imports neither pgstore nor durable: both import it.
package pgengine
