package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"testing"
)

// writeFileLines writes every line, in order, whole, to a pipe whose
// reader takes less than a line at a time: more lines than one writev
// takes and more bytes than the pipe holds, so that writes end within a
// line and the rest follows; empty lines among them.
func TestWriteFileLines(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var lines [][]byte
	var want bytes.Buffer
	for i := range 3*iovMax + 17 {
		l := fmt.Appendf(nil, "%d %s\n", i, bytes.Repeat([]byte{'x'}, i%700))
		if i%100 == 0 {
			l = nil
		}
		lines = append(lines, l)
		want.Write(l)
	}
	got := make(chan []byte)
	go func() {
		var b bytes.Buffer
		buf := make([]byte, 333)
		for {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if err == io.EOF {
				got <- b.Bytes()
				return
			}
			if err != nil {
				got <- nil
				return
			}
		}
	}()
	if err := writeFileLines(w, lines); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("read %d bytes, want %d; equal %v", len(b), want.Len(), bytes.Equal(b, want.Bytes()))
	}
}
