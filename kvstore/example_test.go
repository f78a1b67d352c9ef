package kvstore_test

import (
	"fmt"

	"github.com/ratekit/ratekit/kvstore"
)

// Refill.Apply is the reference semantics every kvstore.Atomic store
// follows; it is a pure function of the stored record and the store's
// clock (in microseconds). A bucket of 10 units refilling 2 units per
// microsecond, absent (so full) at first:
func ExampleRefill_Apply() {
	r := kvstore.Refill{Burst: 10, Rate: 2}
	res, rec, write, _ := r.Apply(kvstore.Record{}, false, 100, kvstore.OpTake, 8)
	fmt.Printf("take 8 at t=100: ok=%v level=%d write=%v\n", res.OK, res.Remaining, write)
	res, _, write, _ = r.Apply(rec, true, 101, kvstore.OpTake, 8)
	fmt.Printf("take 8 at t=101: ok=%v level=%d write=%v\n", res.OK, res.Remaining, write)
	res, _, _, _ = r.Apply(rec, true, 103, kvstore.OpTake, 8)
	fmt.Printf("take 8 at t=103: ok=%v level=%d\n", res.OK, res.Remaining)
	// Output:
	// take 8 at t=100: ok=true level=2 write=true
	// take 8 at t=101: ok=false level=4 write=false
	// take 8 at t=103: ok=true level=0
}
