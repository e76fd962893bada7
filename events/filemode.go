package events

import (
	"errors"
	"fmt"
)

// ErrUnsafeMode: a filled file's mode makes it writable by anyone, or is
// setuid, setgid or sticky.
var ErrUnsafeMode = errors.New("a filled file must not be world-writable, setuid, setgid or sticky")

// CheckFileModes refuses a want that declares a file with an unsafe mode.
// Filled files hold credentials: such a mode is a mistake the wire format
// allows (DESIGN.md §3: 3 or 4 octal digits, which [Want.Validate] checks)
// and the controller's verb, `meshfold want`, refuses. It is not part of
// Validate, so the fold still accepts every want the contract does.
//
// Errors: a *FieldError (matching ErrInvalid) wrapping [ErrUnsafeMode],
// for the first such file.
func CheckFileModes(w *Want) error {
	for i, m := range w.Modules {
		for j, f := range m.Files {
			if f.Mode.Perm()&0o7002 != 0 {
				return fieldErr(fmt.Sprintf("modules[%d].files[%d].mode", i, j), string(f.Mode), ErrUnsafeMode)
			}
		}
	}
	return nil
}
