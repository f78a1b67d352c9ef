//go:build unix

package busypoll

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

const supported = true

// pollState is what a poll's callback works on, kept in the connection so
// that a poll allocates nothing: the callback is bound once, on the
// connection's first poll. Reads of one connection do not overlap.
type pollState struct {
	fn     func(fd uintptr) bool // c.pollFD, bound once
	buf    []byte
	start  time.Time
	n      int
	errno  error
	caught bool
}

// poll reads into b without blocking, every gap, for up to Spin.
// caught reports whether it ended with data, the end of the stream or an
// error of the socket, which n and err then say as the connection's Read
// says them; otherwise the caller parks on the read as usual (which also
// reports a closed connection or a passed deadline).
func (c *conn) poll(b []byte) (n int, caught bool, err error) {
	p := &c.p
	if p.fn == nil {
		p.fn = c.pollFD
	}
	p.buf, p.start, p.caught = b, time.Now(), false
	rerr := c.raw.Read(p.fn)
	n, errno := p.n, p.errno
	p.buf, p.errno = nil, nil
	switch {
	case rerr != nil || !p.caught:
		return 0, false, nil
	case errno != nil:
		return 0, true, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, true, io.EOF
	}
	return n, true, nil
}

// pollFD is poll's callback on the socket's descriptor.
func (c *conn) pollFD(fd uintptr) bool {
	p := &c.p
	for {
		p.n, p.errno = syscall.Read(int(fd), p.buf)
		switch p.errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
		default:
			p.caught = true
			return true
		}
		// Wait a little before the next read: a read system call
		// costs a microsecond or more, and the reply needs no faster
		// notice than this.
		for t := time.Now(); time.Since(t) < gap; {
		}
		if time.Since(p.start) >= Spin {
			return true
		}
	}
}

// gap is the time between two reads of a poll.
const gap = 2 * time.Microsecond
