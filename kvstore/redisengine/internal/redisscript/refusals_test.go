package redisscript

import (
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

func TestRefusalsPickTheOrder(t *testing.T) {
	var r Refusals
	op, h := r.TakeOp("a")
	if op != "T" {
		t.Fatalf("a key never refused: %q, want T", op)
	}
	r.Took(op, h, false)
	if op, _ := r.TakeOp("a"); op != "t" {
		t.Fatalf("after a refusal: %q, want t", op)
	}
	// Another key in another slot is not affected.
	other := "b"
	for i := 0; ; i++ {
		if _, g := r.TakeOp(other); g%refusalSlots != h%refusalSlots {
			break
		}
		other += "b"
	}
	if op, _ := r.TakeOp(other); op != "T" {
		t.Fatalf("another key after a's refusal: %q, want T", op)
	}
	// A read-first take that is refused again keeps the key read first; an
	// admitted one sends it back to decrement first.
	r.Took("t", h, false)
	if op, _ := r.TakeOp("a"); op != "t" {
		t.Fatalf("after a second refusal: %q, want t", op)
	}
	r.Took("t", h, true)
	if op, _ := r.TakeOp("a"); op != "T" {
		t.Fatalf("after an admission: %q, want T", op)
	}
	// An admission of a key that shares the slot does not clear it.
	r.Took("T", h, false)
	r.Took("t", h^refusalSlots, true)
	if op, _ := r.TakeOp("a"); op != "t" {
		t.Fatalf("after another key's admission: %q, want t", op)
	}
	// Peeks and refunds have their own arguments and leave the slots alone.
	if op, h := r.OpArg(kvstore.OpPeek, "a"); op != "p" || h != 0 {
		t.Fatalf("peek: %q, %d", op, h)
	}
	if op, h := r.OpArg(kvstore.OpRefund, "a"); op != "r" || h != 0 {
		t.Fatalf("refund: %q, %d", op, h)
	}
	r.Took("r", h, true)
	r.Took("p", h, true)
	if op, _ := r.OpArg(kvstore.OpTake, "a"); op != "t" {
		t.Fatalf("after a peek and a refund: %q, want t", op)
	}
}

func TestRefusalsKeysTakenTogether(t *testing.T) {
	var r Refusals
	ab := []string{"a", "b"}
	op, h := r.TakeOpKeys(ab)
	if op != "T" {
		t.Fatalf("keys never refused: %q, want T", op)
	}
	r.Took(op, h, false)
	if op, _ := r.TakeOpKeys(ab); op != "t" {
		t.Fatalf("after a refusal: %q, want t", op)
	}
	// Neither key alone, nor the keys split otherwise, share the hash.
	for _, other := range [][]string{{"a"}, {"b"}, {"ab"}, {"a", "b", ""}, {"b", "a"}} {
		if _, g := r.TakeOpKeys(other); g == h {
			t.Fatalf("%q hashes as %q", other, ab)
		}
	}
	if _, g := r.TakeOp("a"); g == h {
		t.Fatal("key a alone hashes as a and b together")
	}
	r.Took("t", h, true)
	if op, _ := r.TakeOpKeys(ab); op != "T" {
		t.Fatalf("after an admission: %q, want T", op)
	}
}
