package pgengine

// Handle carries a [Store] inside a type of another package without
// exporting it: pgstore.Store embeds a Handle, which gives it the
// unexported method of [Carrier], and [From] reads the Store back. The zero
// Handle carries none.
type Handle struct{ s *Store }

// NewHandle returns a Handle that carries s.
func NewHandle(s *Store) Handle { return Handle{s: s} }

func (h Handle) engine() *Store { return h.s }

// Carrier is a value that embeds a [Handle], such as *pgstore.Store. Only
// this package can declare the method, so every Carrier embeds a Handle.
type Carrier interface{ engine() *Store }

// From returns the Store that c carries: nil for a zero Handle (a
// pgstore.Store not made by pgstore.New). c must not be a nil pointer.
func From(c Carrier) *Store { return c.engine() }
