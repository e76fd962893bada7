package store

// MaxControlLine is the control line a server running meshfold's
// operator mode accepts, in bytes (nats-server's max_control_line;
// default 4096): a user's JWT travels in its CONNECT line, and the
// reconciler's, with its role's permissions, is near 4 KiB.
const MaxControlLine = 16 << 10

// ServerAuth is what an embedded server (package store/embedded) needs for
// operator mode, as package store/auth makes it: plain JWTs, so that the
// issuer and every client link no server. The accounts are held by an
// in-memory resolver, preloaded at start; an account JWT pushed later by
// a system-account user on $SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE (a
// revocation, say) replaces the loaded one at once, without a restart.
// Every account given here is loaded at start, so such a push is never
// skipped as "not loaded".
type ServerAuth struct {
	// OperatorJWT is the trusted operator's JWT.
	OperatorJWT string
	// SystemAccount is the public key (A...) of the system account.
	SystemAccount string
	// AccountJWTs are the JWTs of every account, the system account's
	// included, each signed by the operator.
	AccountJWTs []string
}
