package events

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
	// A field an older client ignores (DESIGN.md §3).
	Unchanged bool `json:"unchanged,omitempty"`
}
