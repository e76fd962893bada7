package events

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
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
	// ErrNotPublisher: an operator event on a named subject
	// ([Subjects.Named]) whose `by` is not the operator its subject
	// names, the one whose credentials the server let publish it.
	ErrNotPublisher = errors.New("is not the operator whose credentials published the event")

	ErrMissing      = errors.New("required")
	ErrBadName      = errors.New("must match [a-z0-9][a-z0-9_-]{0,62}")
	ErrBadPath      = errors.New("must be absolute and clean (no .., no NUL, no trailing slash)")
	ErrBadMode      = errors.New("must be 3 or 4 octal digits")
	ErrBadValue     = errors.New("not one of the allowed values")
	ErrDuplicate    = errors.New("declared twice")
	ErrProvisioners = errors.New("more than one provisioner module")
	ErrVersion      = errors.New("must be a schema version from 1")
	ErrTooLong      = errors.New("too long")
	ErrTooMany      = errors.New("too many")
	ErrControl      = errors.New("must not hold a newline, a control character or invalid UTF-8")
	ErrBadAccount   = errors.New("must be a user name: [a-z_][a-z0-9_-]{0,31}")
	ErrReserved     = errors.New("is inside the node agent's reserved directory " + ReservedDir)
	ErrNotUTC       = errors.New("must be RFC 3339 in UTC (Z)")
)

// LimitError is the error of a value over one of the limits of
// DESIGN.md §10 (see limits.go): it says the limit and the size found.
// It wraps [ErrTooLong] or [ErrTooMany].
type LimitError struct {
	Err   error // ErrTooLong or ErrTooMany
	Got   int   // the length in bytes, or the count
	Limit int
	Name  string // the limit's name in package events, e.g. "MaxPath"
}

func (e *LimitError) Error() string {
	unit := ""
	if e.Err == ErrTooLong {
		unit = " bytes"
	}
	return fmt.Sprintf("%v: %d%s, the limit is %d (events.%s)", e.Err, e.Got, unit, e.Limit, e.Name)
}

// Unwrap returns ErrTooLong or ErrTooMany.
func (e *LimitError) Unwrap() error { return e.Err }

func tooLong(field, value string, limit int, name string) error {
	return fieldErr(field, value, &LimitError{Err: ErrTooLong, Got: len(value), Limit: limit, Name: name})
}

func tooMany(field string, got, limit int, name string) error {
	return fieldErr(field, "", &LimitError{Err: ErrTooMany, Got: got, Limit: limit, Name: name})
}

// FieldError names the field that failed validation and why. Field is a
// JSON path such as "modules[2].files[0].path".
type FieldError struct {
	Field string
	Value string // the offending value; empty when missing
	Err   error  // one of the sentinels of this package, or a *LimitError
}

// Error names the field and the value, quoted and cut when long ([Short]).
func (e *FieldError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("%s %s: %v", e.Field, Short(e.Value), e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Field, e.Err)
}

// Unwrap returns the specific sentinel (or *LimitError) and ErrInvalid.
func (e *FieldError) Unwrap() []error { return []error{e.Err, ErrInvalid} }

func fieldErr(field, value string, err error) error {
	return &FieldError{Field: field, Value: value, Err: err}
}

// at places a field error of element i of list: "owed" and "path" give
// "owed[2].path", an error without a field gives "owed[2]". Element
// checks name their fields relative to the element and the loop places
// the error, so that a path is built only for an error: building
// "modules[%d].name" and its siblings for every element of every event
// was most of a have's validation (issue 17).
func at(list string, i int, err error) error {
	fe, ok := err.(*FieldError)
	if !ok {
		return err
	}
	c := *fe
	if c.Field == "" {
		c.Field = fmt.Sprintf("%s[%d]", list, i)
	} else {
		c.Field = fmt.Sprintf("%s[%d].%s", list, i, c.Field)
	}
	return &c
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

// checkText checks a value that is required (when required), at most
// limit bytes long (limitName names the limit) and, when plain, free of
// control characters.
func checkText(field, s string, required, plain bool, limit int, limitName string) error {
	switch {
	case s == "":
		if required {
			return fieldErr(field, "", ErrMissing)
		}
		return nil
	case len(s) > limit:
		return tooLong(field, s, limit, limitName)
	case plain && HasControl(s):
		return fieldErr(field, s, ErrControl)
	}
	return nil
}

func checkBuild(field, s string, required bool) error {
	return checkText(field, s, required, true, MaxBuild, "MaxBuild")
}

// checkAccount checks an account that may be empty.
func checkAccount(field, s string) error {
	if s == "" {
		return nil
	}
	if len(s) > MaxAccount {
		return tooLong(field, s, MaxAccount, "MaxAccount")
	}
	if !ValidAccount(s) {
		return fieldErr(field, s, ErrBadAccount)
	}
	return nil
}

func checkPath(field, p string) error {
	if p == "" {
		return fieldErr(field, "", ErrMissing)
	}
	if len(p) > MaxPath {
		return tooLong(field, p, MaxPath, "MaxPath")
	}
	if HasControl(p) {
		return fieldErr(field, p, ErrControl)
	}
	if !ValidPath(p) {
		return fieldErr(field, p, ErrBadPath)
	}
	return nil
}

// checkFiles checks a module's files; seen, when not nil, collects the
// paths of the whole want or plan (declared twice is an error) and
// reserved refuses paths in [ReservedDir].
func checkFiles(field string, files []File, seen map[string]bool, reserved bool) error {
	if len(files) > MaxFilesPerModule {
		return tooMany(field, len(files), MaxFilesPerModule, "MaxFilesPerModule")
	}
	for i, f := range files {
		if err := checkFile(f, seen, reserved); err != nil {
			return at(field, i, err)
		}
	}
	return nil
}

// checkFile is one file of [checkFiles], its fields named relative to it.
func checkFile(f File, seen map[string]bool, reserved bool) error {
	if err := checkPath("path", f.Path); err != nil {
		return err
	}
	if reserved && InReserved(f.Path) {
		return fieldErr("path", f.Path, ErrReserved)
	}
	if !ValidMode(f.Mode) {
		return fieldErr("mode", string(f.Mode), ErrBadMode)
	}
	if seen != nil {
		if seen[f.Path] {
			return fieldErr("path", f.Path, ErrDuplicate)
		}
		seen[f.Path] = true
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
	if _, off := h.At.Zone(); off != 0 {
		return fieldErr("at", h.At.Format(time.RFC3339Nano), ErrNotUTC)
	}
	return nil
}

// Validate checks names, builds, accounts, paths, modes, the limits of
// DESIGN.md §10, at most one provisioner, no module name or file path
// declared twice, and no path in [ReservedDir]. Modules must be present:
// an explicit empty list removes every module, a missing one is an error.
func (w *Want) Validate() error {
	if err := w.header().validate(); err != nil {
		return err
	}
	if w.Modules == nil {
		return fieldErr("modules", "", ErrMissing)
	}
	if len(w.Modules) > MaxModules {
		return tooMany("modules", len(w.Modules), MaxModules, "MaxModules")
	}
	names := make(map[string]bool, len(w.Modules))
	paths := make(map[string]bool)
	provisioner := ""
	for i, m := range w.Modules {
		if err := checkWantModule(m, names, paths, &provisioner); err != nil {
			return at("modules", i, err)
		}
	}
	return nil
}

// checkWantModule is one module of [Want.Validate], its fields named
// relative to it.
func checkWantModule(m WantModule, names, paths map[string]bool, provisioner *string) error {
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	if names[m.Name] {
		return fieldErr("name", m.Name, ErrDuplicate)
	}
	names[m.Name] = true
	if err := checkBuild("build", m.Build, true); err != nil {
		return err
	}
	if err := checkAccount("runs_as", m.RunsAs); err != nil {
		return err
	}
	if m.Provisioner {
		if *provisioner != "" {
			return fieldErr("provisioner", m.Name, ErrProvisioners)
		}
		*provisioner = m.Name
	}
	if err := checkFiles("files", m.Files, paths, true); err != nil {
		return err
	}
	if len(paths) > MaxFilesPerWant {
		return tooMany("files", len(paths), MaxFilesPerWant, "MaxFilesPerWant")
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
	if err := checkBuild("build", a.Build, true); err != nil {
		return err
	}
	return checkText("by", a.By, true, true, MaxBy, "MaxBy")
}

// Validate checks names, builds, accounts, states, the limits, and that
// only a module not running may have an empty build.
func (h *Have) Validate() error {
	if err := h.header().validate(); err != nil {
		return err
	}
	if len(h.Modules) > MaxHaveModules {
		return tooMany("modules", len(h.Modules), MaxHaveModules, "MaxHaveModules")
	}
	names := make(map[string]bool, len(h.Modules))
	for i, m := range h.Modules {
		if err := checkHaveModule(m, names); err != nil {
			return at("modules", i, err)
		}
	}
	if len(h.Missing) > MaxHaveMissing {
		return tooMany("missing", len(h.Missing), MaxHaveMissing, "MaxHaveMissing")
	}
	for i, m := range h.Missing {
		if err := checkName("module", m.Module); err != nil {
			return at("missing", i, err)
		}
		if err := checkPath("path", m.Path); err != nil {
			return at("missing", i, err)
		}
		if slices.ContainsFunc(h.Missing[:i], func(o MissingFile) bool { return o.Module == m.Module && o.Path == m.Path }) {
			return at("missing", i, fieldErr("path", m.Path, ErrDuplicate))
		}
		if m.AtStart && h.Started == "" {
			return at("missing", i, fieldErr("started", "", ErrMissing))
		}
	}
	if h.Started != "" {
		if err := checkText("started", h.Started, true, true, MaxClaim, "MaxClaim"); err != nil {
			return err
		}
	}
	return nil
}

// checkHaveModule is one module of [Have.Validate], its fields named
// relative to it.
func checkHaveModule(m HaveModule, names map[string]bool) error {
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	if names[m.Name] {
		return fieldErr("name", m.Name, ErrDuplicate)
	}
	names[m.Name] = true
	switch m.State {
	case Running, Stopped, Failed:
	case "":
		return fieldErr("state", "", ErrMissing)
	default:
		return fieldErr("state", string(m.State), ErrBadValue)
	}
	if err := checkBuild("build", m.Build, m.State == Running); err != nil {
		return err
	}
	if err := checkAccount("account", m.Account); err != nil {
		return err
	}
	return checkRuntimeFields(m)
}

// Validate checks the module (empty allowed), op, a non-zero plan and the
// error's length.
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
	return checkText("error", s.Error, false, false, MaxText, "MaxText")
}

func validReason(r Reason) bool {
	switch r {
	case ReasonUndeclared, ReasonNoAccount, ReasonWrongAccount, ReasonWriteFailed:
		return true
	}
	return false
}

// Validate checks module, path, reason, writer and the error's length.
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
	// The writer is what a client declared: any account it may be
	// configured with, judged by the node, not a user-name pattern.
	if err := checkText("writer", r.Writer, true, true, MaxAccount, "MaxAccount"); err != nil {
		return err
	}
	return checkText("error", r.Error, false, false, MaxText, "MaxText")
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
	if err := checkText("digest", f.Digest, true, true, MaxDigest, "MaxDigest"); err != nil {
		return err
	}
	if f.Claim != "" {
		return checkText("claim", f.Claim, true, true, MaxClaim, "MaxClaim")
	}
	return nil
}

// Validate checks the plan's rows like a want's, and its limits.
func (p *Plan) Validate() error {
	if err := p.header().validate(); err != nil {
		return err
	}
	if p.Cause == 0 {
		return fieldErr("cause", "", ErrMissing)
	}
	if err := checkAccount("provisioner_account", p.ProvisionerAccount); err != nil {
		return err
	}
	if len(p.Modules) > MaxModules {
		return tooMany("modules", len(p.Modules), MaxModules, "MaxModules")
	}
	names := make(map[string]bool, len(p.Modules))
	paths := make(map[string]bool)
	for i, m := range p.Modules {
		if err := checkPlanModule(m, names, paths); err != nil {
			return at("modules", i, err)
		}
	}
	return nil
}

// checkPlanModule is one row of [Plan.Validate], its fields named
// relative to it.
func checkPlanModule(m PlanModule, names, paths map[string]bool) error {
	if err := checkName("name", m.Name); err != nil {
		return err
	}
	if names[m.Name] {
		return fieldErr("name", m.Name, ErrDuplicate)
	}
	names[m.Name] = true
	if err := checkBuild("build", m.Build, !m.Held); err != nil {
		return err
	}
	if err := checkBuild("pending", m.Pending, false); err != nil {
		return err
	}
	if err := checkAccount("runs_as", m.RunsAs); err != nil {
		return err
	}
	switch m.Why {
	case "":
		if m.Held {
			return fieldErr("why", "", ErrMissing)
		}
	case HoldWant, HoldApproval:
	default:
		return fieldErr("why", string(m.Why), ErrBadValue)
	}
	// A held row carries the files of what runs, which an older plan
	// declared: the per-want file limit does not apply.
	return checkFiles("files", m.Files, paths, false)
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
		case KnockDeclared, KnockAccount, KnockWriteFailed, KnockOperator, KnockAgent, KnockMissing:
		default:
			return fieldErr(fmt.Sprintf("reasons[%d]", i), string(r), ErrBadValue)
		}
	}
	if len(k.Owed) > MaxOwedPerKnock {
		return tooMany("owed", len(k.Owed), MaxOwedPerKnock, "MaxOwedPerKnock")
	}
	for i, o := range k.Owed {
		if err := checkOwed(o); err != nil {
			return at("owed", i, err)
		}
	}
	return nil
}

// checkOwed is one owed item of [Knock.Validate], its fields named
// relative to it.
func checkOwed(o Owed) error {
	if err := checkName("module", o.Module); err != nil {
		return err
	}
	if err := checkPath("path", o.Path); err != nil {
		return err
	}
	if !validReason(o.Reason) {
		return fieldErr("reason", string(o.Reason), ErrBadValue)
	}
	return checkText("writer", o.Writer, false, true, MaxAccount, "MaxAccount")
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
	// The reconciler quotes every value it did not write through Short,
	// so a message is one line.
	return checkText("msg", j.Msg, true, true, MaxJournal, "MaxJournal")
}

// checkFreeText refuses free text (an operator's reason) holding a newline
// or a control character, or longer than [MaxText]: it is printed on one
// line of fleet, state and the timeline, and must never be printed raw
// (DESIGN.md §10).
func checkFreeText(field, s string) error {
	return checkText(field, s, false, true, MaxText, "MaxText")
}

// checkBy checks an operator event's by: required, one line, at most
// [MaxBy] bytes.
func checkBy(by string) error {
	return checkText("by", by, true, true, MaxBy, "MaxBy")
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

// Validate checks by and the reason's text.
func (r *Resume) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	if err := checkBy(r.By); err != nil {
		return err
	}
	return checkFreeText("reason", r.Reason)
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
	if err := checkBuild("build", r.Build, true); err != nil {
		return err
	}
	return checkBy(r.By)
}

// Validate checks module, by and the reason's text.
func (g *Gate) Validate() error {
	if err := g.header().validate(); err != nil {
		return err
	}
	if err := checkName("module", g.Module); err != nil {
		return err
	}
	if err := checkBy(g.By); err != nil {
		return err
	}
	return checkFreeText("reason", g.Reason)
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

// Validate checks by and the reason's text.
func (r *Retire) Validate() error {
	if err := r.header().validate(); err != nil {
		return err
	}
	if err := checkBy(r.By); err != nil {
		return err
	}
	return checkFreeText("reason", r.Reason)
}

// Validate checks by and the reason's text.
func (a *Ack) Validate() error {
	if err := a.header().validate(); err != nil {
		return err
	}
	if err := checkBy(a.By); err != nil {
		return err
	}
	return checkFreeText("reason", a.Reason)
}
