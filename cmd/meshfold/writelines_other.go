//go:build !linux

package main

import "os"

// writeFileLines writes lines one after the other to f.
func writeFileLines(f *os.File, lines [][]byte) error {
	return writeEachLine(f, lines)
}
