package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/meshfold/meshfold/store"
)

// DefaultResolverDir is the JWT directory resolver.conf names for a full
// resolver, relative to the nats-server's working directory, when the
// auth directory has no resolver.conf yet: a rewrite keeps the one the
// operator set there ([ResolverDirOf]).
const DefaultResolverDir = "jwt"

// resolverDirLine matches the full resolver's `dir` line of a
// resolver.conf: `dir: "PATH"`, `dir: 'PATH'`, `dir = PATH` or a bare
// PATH (nats-server's configuration syntax), a comment after it allowed.
var resolverDirLine = regexp.MustCompile(`(?:^|[\s{,])dir[ \t]*[:=][ \t]*("(?:[^"\\]|\\.)*"|'[^']*'|[^\s#;,}]+)`)

// ResolverDirOf returns the full resolver's JWT directory that the
// resolver.conf conf names (the first `dir` of its resolver block), and
// whether it names one. `auth add-node` and `revoke` rewrite resolver.conf
// with it, so that an operator's absolute path, as docs/operations.md
// asks for, is not put back to [DefaultResolverDir] (a fresh user's
// finding m5).
func ResolverDirOf(conf string) (string, bool) {
	i := strings.Index(conf, "resolver:")
	if i < 0 {
		return "", false
	}
	m := resolverDirLine.FindStringSubmatch(conf[i:])
	if m == nil {
		return "", false
	}
	v := m[1]
	switch {
	case strings.HasPrefix(v, `"`):
		u, err := strconv.Unquote(v)
		if err != nil {
			return strings.Trim(v, `"`), true
		}
		return u, true
	case strings.HasPrefix(v, "'"):
		return strings.Trim(v, "'"), true
	}
	return v, v != ""
}

// resolverDir returns the JWT directory of the auth directory's
// resolver.conf, [DefaultResolverDir] when it has none or names none.
//
// Errors: a resolver.conf that exists and cannot be read.
func (d *Dir) resolverDir() (string, error) {
	b, err := os.ReadFile(d.resolverPath())
	if errors.Is(err, fs.ErrNotExist) {
		return DefaultResolverDir, nil
	}
	if err != nil {
		return "", fmt.Errorf("resolver.conf: %w", err)
	}
	if dir, ok := ResolverDirOf(string(b)); ok {
		return dir, nil
	}
	return DefaultResolverDir, nil
}

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
