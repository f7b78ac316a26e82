package broker

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpSentLinux reads the bytes acknowledged (TCP_INFO) and those still
// in the send queue (SIOCOUTQ: unacknowledged or unsent). The queue is
// read first: an acknowledgement arriving in between makes end a little
// further than it is, never nearer, so a mark is received no sooner.
func tcpSentLinux(c *net.TCPConn) (acked, end uint64, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	cerr := rc.Control(func(fd uintptr) {
		outq, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		if err != nil {
			return
		}
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return
		}
		acked, end, ok = info.Bytes_acked, info.Bytes_acked+uint64(max(outq, 0)), true
	})
	return acked, end, ok && cerr == nil
}
