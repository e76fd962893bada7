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
