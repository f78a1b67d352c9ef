//go:build race && !js

package redistest

// AllocSlack is the slack a test gives an allocation bound: under the race
// detector, sync.Pool drops a quarter of what is put back, so that pooled
// buffers are allocated again now and then; 0 without it.
const AllocSlack = 2
