package events

import (
	"fmt"

	"github.com/segmentio/encoding/json"
)

// Fill request headers (DESIGN.md §3). A fill request travels by NATS
// request/reply on [Subjects.Fill], a subject no stream captures; its body
// is the file's content. Header names are matched case-sensitively, as
// NATS headers are.
const (
	// HeaderModule names the module whose file is filled.
	HeaderModule = "Meshfold-Module"
	// HeaderPath is the file's absolute, clean path as the plan declares it.
	HeaderPath = "Meshfold-Path"
	// HeaderWriter is the account the provisioner client declares it runs
	// as. It guards against a misconfigured or stale client, not against an
	// attacker: NATS permissions decide who may send fill requests at all.
	HeaderWriter = "Meshfold-Writer"
	// HeaderRequest, optional, names one fill request across its
	// retries: a client sends the same value on every attempt, so that a
	// retry of an attempt whose reply was lost (a timeout) after it wrote
	// the file is answered as filled, not unchanged. Any opaque token up
	// to [MaxAccount] bytes; empty means none.
	HeaderRequest = "Meshfold-Request"
)

// FillReply is the node's JSON reply to a fill request: {ok, reason?,
// error?}. OK is true when the content was written. Reason is set when the
// node refused the write (undeclared, no-account, wrong-account,
// write-failed); Error explains a write failure or a malformed request. A
// reply never carries the content.
type FillReply struct {
	OK     bool   `json:"ok"`
	Reason Reason `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// Unchanged: the file already held that content (same keyed digest),
	// mode and owner; nothing was rewritten and no filled was appended.
	// Not set for a retry of the request that wrote it (the same
	// [HeaderRequest]): that reply is OK, as the lost one was.
	// A field an older client ignores (DESIGN.md §3).
	Unchanged bool `json:"unchanged,omitempty"`
}

// FillRequest is a fill request's header fields (DESIGN.md §3): the
// module and absolute path of the file, the account the client declares
// (the writer) and, optional, the request's id across its retries
// ([HeaderRequest]). The content is the message's body and is never part
// of a FillRequest, so no FillRequest printed, logged or returned in an
// error can hold a secret.
type FillRequest struct {
	Module  string
	Path    string
	Writer  string
	Request string
}

// FillRequestOf reads a fill request from a message's headers h (a
// nats.Header or micro.Headers, which are such maps; names are matched
// exactly, as NATS headers are). It does not validate.
func FillRequestOf(h map[string][]string) FillRequest {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return FillRequest{Module: get(HeaderModule), Path: get(HeaderPath), Writer: get(HeaderWriter), Request: get(HeaderRequest)}
}

// Header returns the request's headers, to be sent as a nats.Header
// (nats.Header(r.Header())); an empty Request is left out.
func (r FillRequest) Header() map[string][]string {
	h := map[string][]string{HeaderModule: {r.Module}, HeaderPath: {r.Path}, HeaderWriter: {r.Writer}}
	if r.Request != "" {
		h[HeaderRequest] = []string{r.Request}
	}
	return h
}

// Validate checks the request: Module a name, Path absolute and clean,
// both at most their limits; Writer present, at most [MaxAccount] bytes;
// Request at most [MaxAccount] bytes; none holding a control character.
//
// Errors: a *FieldError naming the header (matching ErrInvalid and
// ErrMissing, ErrBadName, ErrBadPath, ErrControl or ErrTooLong).
func (r FillRequest) Validate() error {
	switch {
	case r.Module == "":
		return fieldErr(HeaderModule, "", ErrMissing)
	case !ValidName(r.Module):
		return fieldErr(HeaderModule, r.Module, ErrBadName)
	case r.Path == "":
		return fieldErr(HeaderPath, "", ErrMissing)
	case len(r.Path) > MaxPath:
		return tooLong(HeaderPath, r.Path, MaxPath, "MaxPath")
	case HasControl(r.Path):
		return fieldErr(HeaderPath, r.Path, ErrControl)
	case !ValidPath(r.Path):
		return fieldErr(HeaderPath, r.Path, ErrBadPath)
	case r.Writer == "":
		return fieldErr(HeaderWriter, "", ErrMissing)
	case len(r.Writer) > MaxAccount:
		return tooLong(HeaderWriter, r.Writer, MaxAccount, "MaxAccount")
	case HasControl(r.Writer):
		return fieldErr(HeaderWriter, r.Writer, ErrControl)
	case len(r.Request) > MaxAccount:
		return tooLong(HeaderRequest, r.Request, MaxAccount, "MaxAccount")
	case HasControl(r.Request):
		return fieldErr(HeaderRequest, r.Request, ErrControl)
	}
	return nil
}

// Validate checks the reply's shape: a refusal (OK false with a Reason)
// names a known reason; an accepted write (OK) carries no Reason;
// Unchanged comes only with OK. OK false without a Reason is valid: the
// node did not judge the write (stopping, or a malformed request), and
// Error says why.
//
// Errors: a *FieldError naming the JSON field (matching ErrInvalid and
// ErrBadValue).
func (r FillReply) Validate() error {
	switch {
	case r.Reason != "" && !validReason(r.Reason):
		return fieldErr("reason", string(r.Reason), ErrBadValue)
	case r.OK && r.Reason != "":
		return fieldErr("reason", string(r.Reason), fmt.Errorf("%w: set on an accepted write", ErrBadValue))
	case r.Unchanged && !r.OK:
		return fieldErr("unchanged", "true", fmt.Errorf("%w: set on a write not accepted", ErrBadValue))
	}
	return nil
}

// DecodeFillReply parses a node's reply to a fill request and validates
// it. Unknown fields are ignored.
//
// Errors: ErrMalformed when data is not a JSON object of the reply's
// shape; [FillReply.Validate]'s.
func DecodeFillReply(data []byte) (FillReply, error) {
	var r FillReply
	if err := json.Unmarshal(data, &r); err != nil {
		return FillReply{}, fmt.Errorf("%w: fill reply: %s", ErrMalformed, ErrorText(err.Error()))
	}
	return r, r.Validate()
}

// HeaderSize is the bytes headers h take in a NATS message, as the
// client encodes them ("NATS/1.0\r\n", then "Name: value\r\n" for each
// value, then "\r\n"): a server's max_payload bounds them and the body
// together. 0 for no header.
func HeaderSize(h map[string][]string) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// FillTraceRoom is the room left in a fill request for the trace
// context headers a traced provisioner adds (traceparent, 69 bytes
// encoded, and a tracestate).
const FillTraceRoom = 256

// FillRequestRoom is the most bytes the headers of a fill request of
// module's file path take ([HeaderSize] of [FillRequest.Header] with a
// writer and a request id of [MaxAccount] bytes, and [FillTraceRoom]):
// what a server's max_payload must hold beside the content, whichever
// provisioner sends it.
func FillRequestRoom(module, path string) int {
	long := string(make([]byte, MaxAccount))
	return HeaderSize(FillRequest{Module: module, Path: path, Writer: long, Request: long}.Header()) + FillTraceRoom
}
