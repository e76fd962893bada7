package events

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Errors of validation and decoding. Validation errors come as a
// *FieldError that wraps one of the specific sentinels below and ErrInvalid.
var (
	// ErrInvalid matches every validation failure.
	ErrInvalid = errors.New("invalid event")
	// ErrMalformed: the payload is not a JSON object of the kind's shape.
	ErrMalformed = errors.New("malformed payload")
	// ErrUnknownKind: the subject's last token is not an event kind.
	ErrUnknownKind = errors.New("unknown event kind")
	// ErrNewerVersion: the payload's `v` is newer than [Version].
	ErrNewerVersion = errors.New("newer schema version than this build understands")
	// ErrBadSubject: the subject is not of the form this package builds.
	ErrBadSubject = errors.New("not a meshfold subject")

	ErrMissing      = errors.New("required")
	ErrBadName      = errors.New("must match [a-z0-9][a-z0-9_-]{0,62}")
	ErrBadPath      = errors.New("must be absolute and clean (no .., no NUL, no trailing slash)")
	ErrBadMode      = errors.New("must be 3 or 4 octal digits")
	ErrBadValue     = errors.New("not one of the allowed values")
	ErrDuplicate    = errors.New("declared twice")
	ErrProvisioners = errors.New("more than one provisioner module")
	ErrVersion      = errors.New("must be a schema version from 1")
	ErrControl      = errors.New("must not hold a newline or a control character")
)

// FieldError names the field that failed validation and why. Field is a
// JSON path such as "modules[2].files[0].path".
type FieldError struct {
	Field string
	Value string // the offending value, quoted; empty when missing
	Err   error  // one of the sentinels of this package
}

func (e *FieldError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("%s %q: %v", e.Field, e.Value, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Field, e.Err)
}

// Unwrap returns the specific sentinel and ErrInvalid.
func (e *FieldError) Unwrap() []error { return []error{e.Err, ErrInvalid} }

func fieldErr(field, value string, err error) error {
	return &FieldError{Field: field, Value: value, Err: err}
}

// ValidName reports whether s is a valid node or module name:
// [a-z0-9][a-z0-9_-]{0,62}.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// ValidPath reports whether p is absolute and clean: no "..", no NUL, no
// trailing slash, not the root itself.
func ValidPath(p string) bool {
	return len(p) > 1 && p[0] == '/' && path.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// ValidMode reports whether m is 3 or 4 octal digits.
func ValidMode(m Mode) bool {
	if len(m) != 3 && len(m) != 4 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if m[i] < '0' || m[i] > '7' {
			return false
		}
	}
	return true
}

// Perm returns the mode as permission bits. The mode must be valid.
func (m Mode) Perm() uint32 {
	var v uint32
	for i := 0; i < len(m); i++ {
		v = v<<3 | uint32(m[i]-'0')
	}
	return v
}

func checkName(field, s string) error {
	if s == "" {
		return fieldErr(field, "", ErrMissing)
	}
	if !ValidName(s) {
		return fieldErr(field, s, ErrBadName)
	}
	return nil
}

func checkRequired(field, s string) error {
	if s == "" {
		return fieldErr(field, "", ErrMissing)
	}
	return nil
}

func checkPath(field, p string) error {
	if p == "" {
		return fieldErr(field, "", ErrMissing)
	}
	if !ValidPath(p) {
		return fieldErr(field, p, ErrBadPath)
	}
	return nil
}

func checkFiles(field string, files []File, seen map[string]bool) error {
	for i, f := range files {
		fp := fmt.Sprintf("%s[%d]", field, i)
		if err := checkPath(fp+".path", f.Path); err != nil {
			return err
		}
		if !ValidMode(f.Mode) {
			return fieldErr(fp+".mode", string(f.Mode), ErrBadMode)
		}
		if seen != nil {
			if seen[f.Path] {
				return fieldErr(fp+".path", f.Path, ErrDuplicate)
			}
			seen[f.Path] = true
		}
	}
	return nil
}

func (h *Header) validate() error {
	if h.V < 1 {
		return fieldErr("v", "", ErrVersion)
	}
	if h.At.IsZero() {
		return fieldErr("at", "", ErrMissing)
	}
	return nil
}

// Validate checks names, builds, paths, modes, at most one provisioner, and
// no module name or file path declared twice in the want.
func (w *Want) Validate() error {
	if err := w.header().validate(); err != nil {
		return err
	}
	names := make(map[string]bool, len(w.Modules))
	paths := make(map[string]bool)
	provisioner := ""
	for i, m := range w.Modules {
		f := fmt.Sprintf("modules[%d]", i)
		if err := checkName(f+".name", m.Name); err != nil {
			return err
		}
		if names[m.Name] {
			return fieldErr(f+".name", m.Name, ErrDuplicate)
		}
		names[m.Name] = true
		if err := checkRequired(f+".build", m.Build); err != nil {
			return err
		}
		if m.Provisioner {
			if provisioner != "" {
				return fieldErr(f+".provisioner", m.Name, ErrProvisioners)
			}
			provisioner = m.Name
		}
		if err := checkFiles(f+".files", m.Files, paths); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks module, build and by.
func (a *Approve) Validate() error {
	if err := a.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", a.Module); err != nil {
		return err
	}
	if err := checkRequired("build", a.Build); err != nil {
		return err
	}
	return checkRequired("by", a.By)
}

// Validate checks names, states and that only a module not running may
// have an empty build.
func (h *Have) Validate() error {
	if err := h.header().validate(); err != nil {
		return err
	}
	names := make(map[string]bool, len(h.Modules))
	for i, m := range h.Modules {
		f := fmt.Sprintf("modules[%d]", i)
		if err := checkName(f+".name", m.Name); err != nil {
			return err
		}
		if names[m.Name] {
			return fieldErr(f+".name", m.Name, ErrDuplicate)
		}
		names[m.Name] = true
		switch m.State {
		case Running, Stopped, Failed:
		case "":
			return fieldErr(f+".state", "", ErrMissing)
		default:
			return fieldErr(f+".state", string(m.State), ErrBadValue)
		}
		if m.State == Running && m.Build == "" {
			return fieldErr(f+".build", "", ErrMissing)
		}
	}
	return nil
}

// Validate checks the module (empty allowed), op and a non-zero plan.
func (s *Settle) Validate() error {
	if err := s.header().validate(); err != nil {
		return err
	}
	if s.Module != "" && !ValidName(s.Module) {
		return fieldErr("module", s.Module, ErrBadName)
	}
	switch s.Op {
	case OpApply, OpRemove, OpFailed:
	case "":
		return fieldErr("op", "", ErrMissing)
	default:
		return fieldErr("op", string(s.Op), ErrBadValue)
	}
	if s.Plan == 0 {
		return fieldErr("plan", "", ErrMissing)
	}
	return nil
}

func validReason(r Reason) bool {
	switch r {
	case ReasonUndeclared, ReasonNoAccount, ReasonWrongAccount, ReasonWriteFailed:
		return true
	}
	return false
}

// Validate checks module, path, reason and writer.
func (r *Refusal) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", r.Module); err != nil {
		return err
	}
	if err := checkPath("path", r.Path); err != nil {
		return err
	}
	if r.Reason == "" {
		return fieldErr("reason", "", ErrMissing)
	}
	if !validReason(r.Reason) {
		return fieldErr("reason", string(r.Reason), ErrBadValue)
	}
	return checkRequired("writer", r.Writer)
}

// Validate checks module, path and digest.
func (f *Filled) Validate() error {
	if err := f.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", f.Module); err != nil {
		return err
	}
	if err := checkPath("path", f.Path); err != nil {
		return err
	}
	return checkRequired("digest", f.Digest)
}

// Validate checks the plan's rows like a want's.
func (p *Plan) Validate() error {
	if err := p.header().validate(); err != nil {
		return err
	}
	if p.Cause == 0 {
		return fieldErr("cause", "", ErrMissing)
	}
	names := make(map[string]bool, len(p.Modules))
	paths := make(map[string]bool)
	for i, m := range p.Modules {
		f := fmt.Sprintf("modules[%d]", i)
		if err := checkName(f+".name", m.Name); err != nil {
			return err
		}
		if names[m.Name] {
			return fieldErr(f+".name", m.Name, ErrDuplicate)
		}
		names[m.Name] = true
		if !m.Held && m.Build == "" {
			return fieldErr(f+".build", "", ErrMissing)
		}
		switch m.Why {
		case "":
			if m.Held {
				return fieldErr(f+".why", "", ErrMissing)
			}
		case HoldWant, HoldApproval:
		default:
			return fieldErr(f+".why", string(m.Why), ErrBadValue)
		}
		if err := checkFiles(f+".files", m.Files, paths); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the cause, reasons and owed items.
func (k *Knock) Validate() error {
	if err := k.header().validate(); err != nil {
		return err
	}
	if k.Cause == 0 {
		return fieldErr("cause", "", ErrMissing)
	}
	for i, r := range k.Reasons {
		switch r {
		case KnockDeclared, KnockAccount, KnockWriteFailed, KnockOperator:
		default:
			return fieldErr(fmt.Sprintf("reasons[%d]", i), string(r), ErrBadValue)
		}
	}
	for i, o := range k.Owed {
		f := fmt.Sprintf("owed[%d]", i)
		if err := checkName(f+".module", o.Module); err != nil {
			return err
		}
		if err := checkPath(f+".path", o.Path); err != nil {
			return err
		}
		if !validReason(o.Reason) {
			return fieldErr(f+".reason", string(o.Reason), ErrBadValue)
		}
	}
	return nil
}

// Validate checks the level and message.
func (j *Journal) Validate() error {
	if err := j.header().validate(); err != nil {
		return err
	}
	switch j.Level {
	case LevelInfo, LevelWarn, LevelError:
	case "":
		return fieldErr("level", "", ErrMissing)
	default:
		return fieldErr("level", string(j.Level), ErrBadValue)
	}
	return checkRequired("msg", j.Msg)
}

// checkFreeText refuses free text (an operator's reason) holding a newline
// or a control character: it is printed on one line of fleet, state and
// the timeline, and must never be printed raw (DESIGN.md §10).
func checkFreeText(field, s string) error {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fieldErr(field, "", ErrControl)
		}
	}
	return nil
}

// checkBy checks an operator event's by: required, one line.
func checkBy(by string) error {
	if err := checkRequired("by", by); err != nil {
		return err
	}
	return checkFreeText("by", by)
}

// Validate checks by and the reason's text.
func (p *Pause) Validate() error {
	if err := p.header().validate(); err != nil {
		return err
	}
	if err := checkBy(p.By); err != nil {
		return err
	}
	return checkFreeText("reason", p.Reason)
}

// Validate checks by.
func (r *Resume) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	return checkBy(r.By)
}

// Validate checks by and the reason's text.
func (p *Poke) Validate() error {
	if err := p.header().validate(); err != nil {
		return err
	}
	if err := checkBy(p.By); err != nil {
		return err
	}
	return checkFreeText("reason", p.Reason)
}

// Validate checks module, build and by, as an approval's.
func (r *Revoke) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", r.Module); err != nil {
		return err
	}
	if err := checkRequired("build", r.Build); err != nil {
		return err
	}
	return checkBy(r.By)
}

// Validate checks module, path and by.
func (w *Waive) Validate() error {
	if err := w.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", w.Module); err != nil {
		return err
	}
	if err := checkPath("path", w.Path); err != nil {
		return err
	}
	return checkBy(w.By)
}

// Validate checks by.
func (r *Retire) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	return checkBy(r.By)
}
