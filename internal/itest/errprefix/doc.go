// Package errprefix holds ratekit's error-message rule in a test: an error a
// package returns starts with the package's name, then its class, then what
// happened ("tokenbucket: invalid config: ..."), and names no other package
// before the class. The test finds every exported constructor and validator
// of the library packages itself, reading their source, and fails, naming
// it, for any that its table does not call with invalid input. It has no
// code of its own.
package errprefix
