// Package errprefix holds ratekit's error-message rule in a test: an error a
// package returns starts with the package's name, then what happened, with
// any sentinel it wraps after the prefix ("tokenbucket: ratekit: invalid
// config: ..."), never before it. It has no code of its own.
package errprefix
