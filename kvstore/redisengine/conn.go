package redisengine

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"sync"
	"time"

	"github.com/ratekit/ratekit/kvstore/redisengine/internal/redisscript"
)

// Conn is what an [Engine] needs of a Redis client: the commands it sends.
// kvstore/redisstore adapts go-redis to it, kvstore/rueidisstore adapts
// rueidis; a store on another client implements it the same way. Its
// methods are called concurrently. Errors come back as the client returns
// them: the Engine names the command, and recognises its scripts' error
// replies by their text.
//
// The Engine changes no key, argument or dst it passed while the call
// runs, nor after a call that returned an error, so an implementation may
// refer to them instead of copying them (as go-redis's commands do) and
// may keep them after it gave up waiting; after a call returned without an
// error, it must not use them any more. The keys and arguments are strings
// written into a buffer that the Engine reuses for its next calls once a
// call returned without an error, so that a decision allocates nothing for
// them: what keeps one longer (a client's hook that logs commands later,
// say) must copy it (strings.Clone).
type Conn interface {
	// Eval runs script on keys with args: EVALSHA script.SHA(), and, when
	// the server answers NOSCRIPT, EVAL script.Source() with the same keys
	// and args. It appends the reply's integers to dst and returns dst:
	// one for an integer reply, each element's for an array of integers
	// (script.Array tells which the script sends). A reply of another
	// shape is an error.
	Eval(ctx context.Context, script *Script, keys, args []string, dst []int64) ([]int64, error)

	// Read sends MULTI, then PTTL and GET of each key in order, then
	// EXEC, and writes each key's PTTL reply into ttls and GET reply into
	// values ("" for no key). It reports false with a nil error when it
	// sent nothing (a client may decline, as kvstore/redisstore does when
	// no round trip of its own is free) or when the server refused a
	// command of the transaction: the Engine then decides with a script.
	Read(ctx context.Context, keys []string, ttls []int64, values []string) (bool, error)

	// Get returns the value of key (GET), and false for no key.
	Get(ctx context.Context, key string) (string, bool, error)

	// Set sets key to value, expiring after ttl (SET … PX); ttl is a
	// whole number of milliseconds, at least one.
	Set(ctx context.Context, key, value string, ttl time.Duration) error

	// Del deletes key (DEL).
	Del(ctx context.Context, key string) error

	// Partitioned reports whether the client spreads keys over several
	// servers by hash slot (Redis Cluster), where the keys of one script
	// must share a slot.
	Partitioned() bool
}

// Script is a Lua script that an [Engine] runs through [Conn.Eval]. The
// Engine's scripts are package variables: a Conn may use a *Script as a map
// key.
type Script struct {
	src   string
	array bool
	once  sync.Once
	sha   string
}

// newScript returns the Script of the Lua text src, whose reply is an
// array of integers when array is true and one integer otherwise.
func newScript(src string, array bool) *Script { return &Script{src: src, array: array} }

// Array reports whether the script replies with an array of integers
// rather than with one integer, for a client that reads a reply by its
// expected type (go-redis's IntCmd and IntSliceCmd box nothing).
func (s *Script) Array() bool { return s.array }

// Source returns the script's Lua text, the argument of EVAL.
func (s *Script) Source() string { return s.src }

// SHA returns the SHA-1 of the script's text in lower-case hex, the
// argument of EVALSHA. It is computed on first use, so that importing the
// package hashes nothing.
func (s *Script) SHA() string {
	s.once.Do(func() {
		sum := sha1.Sum([]byte(s.src))
		s.sha = hex.EncodeToString(sum[:])
	})
	return s.sha
}

// The scripts the Engine runs (see package redisscript).
var (
	updateScript = newScript(redisscript.Update, false)
	multiScript  = newScript(redisscript.Multi, true)
	periodScript = newScript(redisscript.MultiPeriod, true)
)
