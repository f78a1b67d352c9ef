package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
)

// A memstore.Store is what tokenbucket uses in process; here it is driven
// through its kvstore.Atomic contract on a fake clock: a level of at most
// 3 units that refills 1 unit a second.
func Example() {
	now := time.Unix(1_700_000_000, 0)
	s, err := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	// Rate is in units per microsecond, so a unit here is a millionth of
	// a token: 3 tokens of capacity, 1 token a second.
	r := kvstore.Refill{Burst: 3_000_000, Rate: 1}
	for i := 1; i <= 4; i++ {
		res, err := s.Update(ctx, "client-42", r, kvstore.OpTake, 1_000_000)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("take %d: ok=%v, %d tokens left\n", i, res.OK, res.Remaining/1_000_000)
	}
	now = now.Add(time.Second)
	res, _ := s.Update(ctx, "client-42", r, kvstore.OpTake, 1_000_000)
	fmt.Printf("a second later: ok=%v\n", res.OK)
	// Output:
	// take 1: ok=true, 2 tokens left
	// take 2: ok=true, 1 tokens left
	// take 3: ok=true, 0 tokens left
	// take 4: ok=false, 0 tokens left
	// a second later: ok=true
}
