package store

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
