// Package itest is a test-only module. Its subdirectories hold the tests of
// library packages that need a dependency the package's own module does not
// require: the Redis tests of tokenbucket and breaker (go-redis, which the
// root and breaker modules do not require), and the fault-injection tests of
// pgstore and redisstore (toxiproxy). They use each package's exported API.
package itest
