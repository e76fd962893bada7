package auth

import (
	"fmt"
	"strings"

	"github.com/meshfold/meshfold/store"
)

// DefaultResolverDir is the JWT directory resolver.conf names for a full
// resolver, relative to the nats-server's working directory.
const DefaultResolverDir = "jwt"

// ResolverConfig returns resolver.conf: the operator (its JWT inline),
// the system account and a full account resolver storing JWTs in
// DefaultResolverDir, preloaded with both accounts' current JWTs. Include
// it from an external nats-server's configuration; see [Dir.ResolverConfigFor].
func (d *Dir) ResolverConfig() (string, error) { return d.ResolverConfigFor(DefaultResolverDir) }

// ResolverConfigFor is [Dir.ResolverConfig] with the full resolver's JWT
// directory jwtDir. A full resolver keeps every account JWT pushed to it
// (auth revoke) and shares it with the other servers of its cluster; the
// preload only ever replaces a stored JWT with a newer one. Its interval
// (10s) is how often each server asks the others for what it lacks, the
// first time one interval after its start: a server that was down during
// a revocation accepts the revoked user for that long after it returns,
// unless its resolver.conf (whose preload carries the new account JWT)
// was copied before (docs/architecture.md, "A server that was down
// during a revocation").
//
// Errors: unreadable JWT files.
func (d *Dir) ResolverConfigFor(jwtDir string) (string, error) {
	a, err := d.ServerAuth()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# meshfold auth: operator %s, accounts %s (%s) and %s (%s).\n", d.m.Operator,
		SystemAccountName, d.m.System, MeshAccountName, d.m.Account)
	b.WriteString("# Written by `meshfold auth`; include it from nats-server.conf: include \"resolver.conf\"\n")
	fmt.Fprintf(&b, "operator: %q\n", strings.TrimSpace(a.OperatorJWT))
	fmt.Fprintf(&b, "system_account: %s\n", d.m.System)
	fmt.Fprintf(&b, "max_control_line: %d # a user's JWT travels in its CONNECT line: the reconciler's is near the default 4 KiB\n", store.MaxControlLine)
	fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %q\n  allow_delete: false\n  interval: \"10s\"\n  timeout: \"1.9s\"\n}\n", jwtDir)
	b.WriteString("resolver_preload: {\n")
	for i, name := range []string{d.m.System, d.m.Account} {
		fmt.Fprintf(&b, "  %s: %q\n", name, strings.TrimSpace(a.AccountJWTs[i]))
	}
	b.WriteString("}\n")
	return b.String(), nil
}
