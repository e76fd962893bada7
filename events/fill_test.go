package events_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// A fill request's headers (DESIGN.md §3) go out and come back the same,
// and validation names the header at fault.
func TestFillRequest(t *testing.T) {
	ok := events.FillRequest{Module: "mesh-build-go", Path: "/run/mesh-build-go/broker.creds", Writer: "prov", Request: "r1"}
	h := ok.Header()
	for k, v := range map[string]string{"Meshfold-Module": ok.Module, "Meshfold-Path": ok.Path, "Meshfold-Writer": ok.Writer, "Meshfold-Request": ok.Request} {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if got := events.FillRequestOf(h); got != ok {
		t.Errorf("FillRequestOf(Header()) = %+v, want %+v", got, ok)
	}
	if _, ok := (events.FillRequest{Module: "a", Path: "/b", Writer: "c"}).Header()[events.HeaderRequest]; ok {
		t.Error("an empty request id is sent")
	}
	if got := events.FillRequestOf(nil); got != (events.FillRequest{}) {
		t.Errorf("FillRequestOf(nil) = %+v", got)
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	long := strings.Repeat("x", events.MaxAccount+1)
	for _, tc := range []struct {
		name   string
		edit   func(*events.FillRequest)
		err    error
		header string
	}{
		{"no module", func(r *events.FillRequest) { r.Module = "" }, events.ErrMissing, events.HeaderModule},
		{"bad module", func(r *events.FillRequest) { r.Module = "Mesh" }, events.ErrBadName, events.HeaderModule},
		{"no path", func(r *events.FillRequest) { r.Path = "" }, events.ErrMissing, events.HeaderPath},
		{"relative path", func(r *events.FillRequest) { r.Path = "run/x" }, events.ErrBadPath, events.HeaderPath},
		{"path with ..", func(r *events.FillRequest) { r.Path = "/run/../etc/shadow" }, events.ErrBadPath, events.HeaderPath},
		{"path with newline", func(r *events.FillRequest) { r.Path = "/run/x\ny" }, events.ErrControl, events.HeaderPath},
		{"long path", func(r *events.FillRequest) { r.Path = "/" + strings.Repeat("p", events.MaxPath) }, events.ErrTooLong, events.HeaderPath},
		{"no writer", func(r *events.FillRequest) { r.Writer = "" }, events.ErrMissing, events.HeaderWriter},
		{"long writer", func(r *events.FillRequest) { r.Writer = long }, events.ErrTooLong, events.HeaderWriter},
		{"writer with control", func(r *events.FillRequest) { r.Writer = "prov\x00" }, events.ErrControl, events.HeaderWriter},
		{"long request", func(r *events.FillRequest) { r.Request = long }, events.ErrTooLong, events.HeaderRequest},
		{"request with newline", func(r *events.FillRequest) { r.Request = "a\nb" }, events.ErrControl, events.HeaderRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			err := r.Validate()
			var fe *events.FieldError
			if !errors.Is(err, tc.err) || !errors.Is(err, events.ErrInvalid) || !errors.As(err, &fe) || fe.Field != tc.header {
				t.Errorf("Validate = %v, want %v naming %s", err, tc.err, tc.header)
			}
		})
	}
	// An account of any shape the client is configured with is the
	// node's to judge, not the request's.
	r := ok
	r.Writer, r.Request = "PROV@example", ""
	if err := r.Validate(); err != nil {
		t.Errorf("writer %q: %v", r.Writer, err)
	}
}

// A fill reply decodes and validates: a refusal names a known reason, an
// accepted write none, and unchanged comes only with ok.
func TestFillReply(t *testing.T) {
	for _, tc := range []struct {
		data string
		want events.FillReply
		err  error
	}{
		{`{"ok":true}`, events.FillReply{OK: true}, nil},
		{`{"ok":true,"unchanged":true}`, events.FillReply{OK: true, Unchanged: true}, nil},
		{`{"ok":true,"error":"filled not recorded: timeout"}`, events.FillReply{OK: true, Error: "filled not recorded: timeout"}, nil},
		{`{"ok":false,"reason":"write-failed","error":"disk full","later":1}`, events.FillReply{Reason: events.ReasonWriteFailed, Error: "disk full"}, nil},
		{`{"ok":false,"error":"node agent is stopping"}`, events.FillReply{Error: "node agent is stopping"}, nil},
		{`{"ok":false,"reason":"maybe"}`, events.FillReply{}, events.ErrBadValue},
		{`{"ok":true,"reason":"undeclared"}`, events.FillReply{}, events.ErrBadValue},
		{`{"ok":false,"unchanged":true}`, events.FillReply{}, events.ErrBadValue},
		{`not json`, events.FillReply{}, events.ErrMalformed},
		{`{"ok":"yes"}`, events.FillReply{}, events.ErrMalformed},
	} {
		got, err := events.DecodeFillReply([]byte(tc.data))
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("DecodeFillReply(%s) = %v, want %v", tc.data, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeFillReply(%s) = %+v, %v, want %+v", tc.data, got, err, tc.want)
		}
	}
}
