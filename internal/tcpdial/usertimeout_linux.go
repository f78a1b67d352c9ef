package tcpdial

import (
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h, which package
// syscall does not define.
const tcpUserTimeout = 0x12

func setUserTimeout(fd uintptr, d time.Duration) error {
	return syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
}

func userTimeout(fd uintptr) (time.Duration, error) {
	ms, err := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout)
	return time.Duration(ms) * time.Millisecond, err
}
