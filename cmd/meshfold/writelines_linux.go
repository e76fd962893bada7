package main

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// writeFileLines writes lines one after the other to f with writev, up
// to iovMax at a time, from where they are: at 100,000 nodes
// copying fleet's 91 MB of lines, in sorted order, into a buffer before
// each write was 4–8 % of `fleet -o json`'s CPU (issue 27). Whatever
// writev refuses (a broken pipe among others) is written again with
// f.Write, which fails as any write to f fails (and for stdout on a
// broken pipe, ends the process as Go does).
func writeFileLines(f *os.File, lines [][]byte) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return writeEachLine(f, lines)
	}
	for len(lines) > 0 {
		batch := lines[:min(len(lines), iovMax)]
		var (
			n    int
			werr error
		)
		err := rc.Write(func(fd uintptr) bool {
			n, werr = unix.Writev(int(fd), batch)
			return !errors.Is(werr, unix.EAGAIN)
		})
		if errors.Is(werr, unix.EINTR) {
			continue
		}
		if err != nil || werr != nil || n <= 0 {
			return writeEachLine(f, lines)
		}
		// Past what was written, the last line perhaps in part.
		for n > 0 {
			if n < len(lines[0]) {
				lines[0] = lines[0][n:]
				break
			}
			n -= len(lines[0])
			lines = lines[1:]
		}
	}
	return nil
}

// iovMax is how many buffers one writev takes at most on Linux
// (UIO_MAXIOV).
const iovMax = 1024

// mapSlab maps size bytes of anonymous memory for a lineArena and asks
// for huge pages (transparent huge pages, which a kernel set to
// "madvise", a common default, gives only when asked); a kernel that
// refuses them still maps the slab.
func mapSlab(size int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, err
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, nil
}

// unmapSlab unmaps a slab of mapSlab.
func unmapSlab(b []byte) { _ = unix.Munmap(b) }
