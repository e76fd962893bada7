package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// The note of a want whose builds are no bundle builds names the first
// few modules and counts the rest, on a line of a few hundred bytes,
// whatever the want's size (a fresh user's finding V10: 5 kB on one line
// for 32 modules); a want of a few names them all.
func TestNotBundleNoteShort(t *testing.T) {
	t.Parallel()
	w := &events.Want{}
	for i := range 32 {
		w.Modules = append(w.Modules, events.WantModule{Name: fmt.Sprintf("mod%02d", i), Build: fmt.Sprintf("img:registry.example/team/mod%02d:1.2.3-with-a-long-tag", i)})
	}
	note := notBundleNote(w)
	if len(note) > 600 || !strings.Contains(note, "mod00 (img:registry.example/team/mod00:1.2.3-with-a-long-tag), mod01 (") ||
		!strings.Contains(note, " and 29 more (every module of the want whose build does not begin sha256:)") || strings.Contains(note, "mod03") {
		t.Errorf("note of 32 modules (%d bytes): %s", len(note), note)
	}
	w.Modules = w.Modules[:3]
	if note := notBundleNote(w); !strings.Contains(note, "mod02 (") || strings.Contains(note, "more") {
		t.Errorf("note of 3 modules: %s", note)
	}
}
