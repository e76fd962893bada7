package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/events"
)

// SummaryFormat is the format of the fleet summaries this build writes
// ([MarshalSummary]): 2, compact binary in base64 (summarybin.go). A
// reader reads it and format 1 (JSON, as the builds before wrote it; the
// same fields) and refuses any other ([ErrSummaryFormat]): it decodes the
// snapshot instead. Bump it whenever [View.FleetSummary] keeps a
// different set of fields (a fleet row that reads a new field of the
// view): an older build's summary would lack it; then stop reading the
// formats that lack it.
//
// Format 3 added the provisioner's record and the count of declared files
// (View.ProvisionerDown); a format 2 summary (an older reconciler's,
// whose fold knows no prov event) is read still, as a view with neither.
// Format 4 added the files the node reported missing (View.Missing); a
// format 3 summary is read still, as a view with none. Format 5 added,
// to each missing file, whether it was gone at the agent's start
// (MissingFile.AtStart); a format 4 summary is read still, as a view
// whose missing files were not. Format 6 added the node's noisy episode
// (View.Noisy, without its Warned): a summary is written in format 6 only
// when it holds one, in format 5 otherwise, so that an older reader
// (which refuses format 6 and reads the node's snapshot instead) does so
// only for a node that flooded.
const SummaryFormat = 6

// summaryJSONFormat is format 1's number: JSON, read still.
const summaryJSONFormat = 1

// ErrSummaryFormat: a summary is not of this build's [SummaryFormat] (or of
// a snapshot format newer than [SnapshotFormat]); read the snapshot.
var ErrSummaryFormat = errors.New("reconcile: fleet summary of another format")

// FleetSummary returns v with only what a fleet row reads
// (audit.FleetRowOfView makes the same row of either, at any time, which
// reconcile/audit's TestFleetSummaryRows checks): the holds waiting for
// an approval, the modules that fail, are unhealthy or have crashed after
// running FlapRestarts times, and whether anything is withheld. The
// accounts, the file count, the owed items' errors, the gates and the
// rest of the runtime and holds are left out.
func (v View) FleetSummary() View {
	s := v
	// Files stays: a row reads whether the plan declares any
	// (View.ProvisionerDown).
	s.ProvisionerAccount, s.RunningAccount, s.OwedWhy = "", "", nil
	s.Gates, s.GatesFull = nil, nil // why a module is held is for state and the audit
	s.Holds = nil
	for _, h := range v.Holds {
		if h.Why == events.HoldApproval && h.Pending != "" {
			s.Holds = append(s.Holds, h)
		}
	}
	s.Runtime = nil
	for _, r := range v.Runtime {
		if r.Failing() || r.Unhealthy() || (r.State == events.Running && len(r.Crashes) >= FlapRestarts) {
			s.Runtime = append(s.Runtime, r)
		}
	}
	if v.Withheld != nil {
		s.Withheld = &PlanDiff{} // a row says only whether something is
	}
	if v.LastKnock != nil {
		s.LastKnock = &KnockRecord{Cause: v.LastKnock.Cause}
	}
	if v.Noisy != nil {
		n := *v.Noisy
		n.Warned = Traffic{} // the fold's, not a row's
		s.Noisy = &n
	}
	return s
}

// summary is a fleet summary as stored: the summary's format, the format
// of the snapshot it summarizes, and the view.
type summary struct {
	Format   int `json:"format"`
	Snapshot int `json:"snapshot"`
	View
}

// MarshalSummary encodes s's fleet summary ([View.FleetSummary]) in
// [SummaryFormat] 4, printable ASCII fit for a NATS header value: "4:"
// then base64 (summarybin.go). The snapshot store puts it beside s's
// snapshot in the same message (store.SummaryHeader), so the two can
// never disagree.
func MarshalSummary(s *State) ([]byte, error) {
	return marshalSummaryBinary(s.View().FleetSummary(), stateFormat(s)), nil
}

// marshalSummaryJSON encodes s's fleet summary in format 1, as the
// builds before format 2 wrote it: JSON of printable ASCII (every other
// character escaped), {"format":1,"snapshot":S,...the view's fields}.
func marshalSummaryJSON(s *State) ([]byte, error) {
	b, err := json.Marshal(summary{Format: summaryJSONFormat, Snapshot: stateFormat(s), View: s.View().FleetSummary()})
	if err != nil {
		return nil, err
	}
	return asciiJSON(b), nil
}

// UnmarshalSummary decodes a summary [MarshalSummary] wrote, or one of
// format 1 (JSON) an earlier build wrote. Strings share data's memory
// (format 1) or memory of their own (format 2); nothing may write data
// once decoded.
//
// Errors: one wrapping [ErrSummaryFormat] for a summary of another
// format, or of a snapshot newer than [SnapshotFormat] (its snapshot reads
// as [ErrSnapshotNewer]); a decode error.
func UnmarshalSummary(data []byte) (View, error) {
	if len(data) > 0 && data[0] == '{' {
		var s summary
		if _, err := json.Parse(data, &s, json.ZeroCopy); err != nil {
			return View{}, fmt.Errorf("reconcile: decode fleet summary: %w", err)
		}
		if s.Format != summaryJSONFormat {
			return View{}, formatError(s.Format, s.Snapshot)
		}
		if s.Snapshot < 0 || s.Snapshot > SnapshotFormat {
			return View{}, formatError(s.Format, s.Snapshot)
		}
		return s.View, nil
	}
	// Format 2 sets no flag of the provisioner, formats 2 and 3 end
	// before the missing files, and format 4's carry no at_start: one
	// decoder reads the four.
	var format int
	switch {
	case bytes.HasPrefix(data, []byte(summaryPrefix)):
		format = SummaryFormat
	case bytes.HasPrefix(data, []byte(summaryPrefix5)):
		format = 5
	case bytes.HasPrefix(data, []byte(summaryPrefix4)):
		format = 4
	case bytes.HasPrefix(data, []byte(summaryPrefix3)):
		format = 3
	case bytes.HasPrefix(data, []byte(summaryPrefix2)):
		format = 2
	default:
		format := -1
		if i := bytes.IndexByte(data, ':'); i > 0 {
			if f, err := strconv.Atoi(string(data[:i])); err == nil {
				format = f
			}
		}
		return View{}, formatError(format, -1)
	}
	v, snapshot, err := unmarshalSummaryBinary(data[len(summaryPrefix):], format)
	if err != nil {
		return View{}, fmt.Errorf("reconcile: decode fleet summary: %w", err)
	}
	if snapshot > SnapshotFormat {
		return View{}, formatError(SummaryFormat, snapshot)
	}
	return v, nil
}

// formatError is [ErrSummaryFormat] for a summary of format (-1: not
// known) of a snapshot of format snapshot (-1: not known).
func formatError(format, snapshot int) error {
	return fmt.Errorf("%w: format %d of snapshot format %d; this build reads formats %d, 2, 3 and %d of snapshot formats 0 to %d",
		ErrSummaryFormat, format, snapshot, summaryJSONFormat, SummaryFormat, SnapshotFormat)
}

// asciiJSON escapes every byte of b outside printable ASCII as JSON's
// \uXXXX (a surrogate pair beyond the BMP). JSON's structure is ASCII, so
// such bytes are inside strings, and the value decodes the same.
func asciiJSON(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] >= 0x20 && b[i] < 0x7f {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, i, len(b)+16)
	copy(out, b[:i])
	for i < len(b) {
		c := b[i]
		if c >= 0x20 && c < 0x7f {
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		i += n
		if r >= 0x10000 {
			r -= 0x10000
			out = appendU(out, 0xd800+(r>>10))
			out = appendU(out, 0xdc00+(r&0x3ff))
			continue
		}
		out = appendU(out, r)
	}
	return out
}

func appendU(b []byte, r rune) []byte {
	b = append(b, `\u`...)
	h := strconv.FormatInt(int64(r), 16)
	for range 4 - len(h) {
		b = append(b, '0')
	}
	return append(b, h...)
}
