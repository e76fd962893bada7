//go:build !linux

package main

import (
	"errors"
	"os"
)

// writeFileLines writes lines one after the other to f.
func writeFileLines(f *os.File, lines [][]byte) error {
	return writeEachLine(f, lines)
}

// mapSlab fails here: a lineArena hands out heap slices.
func mapSlab(int) ([]byte, error) { return nil, errors.ErrUnsupported }

// unmapSlab is not called here.
func unmapSlab([]byte) {}
