package events_test

import (
	"errors"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// TestCheckFileModes: world-writable, setuid, setgid and sticky modes are
// refused, naming the file; the usual modes of credentials pass.
func TestCheckFileModes(t *testing.T) {
	for _, c := range []struct {
		mode events.Mode
		ok   bool
	}{
		{"0600", true}, {"0400", true}, {"640", true}, {"0755", true},
		{"0602", false}, {"0777", false}, {"4700", false}, {"2700", false}, {"1700", false},
	} {
		w := &events.Want{Modules: []events.WantModule{{Name: "a", Build: "x"},
			{Name: "b", Build: "y", Files: []events.File{{Path: "/etc/ok", Mode: "0600"}, {Path: "/etc/b", Mode: c.mode}}}}}
		err := events.CheckFileModes(w)
		if c.ok != (err == nil) {
			t.Errorf("mode %s: err = %v, want ok %v", c.mode, err, c.ok)
			continue
		}
		var fe *events.FieldError
		if err != nil && (!errors.Is(err, events.ErrUnsafeMode) || !errors.Is(err, events.ErrInvalid) ||
			!errors.As(err, &fe) || fe.Field != "modules[1].files[1].mode") {
			t.Errorf("mode %s: err = %v, want a field error on modules[1].files[1].mode wrapping ErrUnsafeMode", c.mode, err)
		}
	}
}
