package shim

import (
	"slices"
	"strings"
	"testing"
)

// TestCopyLinesCutsLongLines checks that copyLines, which reads through a
// small buffer, cuts lines exactly where a reader of maxLogLine bytes did:
// a line of maxLogLine bytes or more becomes pieces of maxLogLine (the
// newline counted in the last), short lines stay whole.
func TestCopyLinesCutsLongLines(t *testing.T) {
	long := strings.Repeat("a", maxLogLine+10)
	whole := strings.Repeat("b", maxLogLine-1)
	in := "short\n" + long + "\n" + whole + "\n" + strings.Repeat("c", maxLogLine) + "\ntail"
	var out strings.Builder
	w := &lineWriter{out: &out}
	w.copyLines(StreamOut, strings.NewReader(in))
	var got []int
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		_, stream, text := ParseLogLine(l)
		if stream != StreamOut {
			t.Fatalf("line %.40q: stream %q", l, stream)
		}
		got = append(got, len(text))
	}
	want := []int{5, maxLogLine, 10, maxLogLine - 1, maxLogLine, 0, 4}
	if !slices.Equal(got, want) {
		t.Fatalf("line lengths %v, want %v", got, want)
	}
}
