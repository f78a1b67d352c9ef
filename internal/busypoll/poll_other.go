//go:build !unix

package busypoll

// supported is false where the socket's non-blocking read is not
// syscall.Read: Wrap returns connections as they are.
const supported = false

type pollState struct{}

func (c *conn) poll([]byte) (int, bool, error) { return 0, false, nil }
