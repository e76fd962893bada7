package auth

import (
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/meshfold/meshfold/events"
)

// AllowedRoles returns the roles whose permissions (Permissions, for the
// stream and prefix names gives) let a user publish to subject (sub
// false) or subscribe to it (sub true): what a client told "permission
// denied" should connect as. A per-node role (node, provisioner) is tried
// for each token of subject that is a valid node name. None: no role may.
func AllowedRoles(subject string, sub bool, names Names) []Role {
	var out []Role
	try := func(r Role, node string) bool {
		p, err := Permissions(r, node, names)
		if err != nil {
			return false
		}
		perm := p.Pub
		if sub {
			perm = p.Sub
		}
		return allows(perm, subject)
	}
	for _, r := range []Role{RoleOperator, RoleOperatorRead, RoleController, RoleReconciler} {
		if try(r, "") {
			out = append(out, r)
		}
	}
	for _, r := range []Role{RoleNode, RoleProvisioner} {
		for _, tok := range strings.Split(subject, ".") {
			if events.ValidName(tok) && try(r, tok) {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// Grants reports whether this build's permissions of role r (for node,
// a per-node role's) let a user publish to subject (sub false) or
// subscribe to it (sub true). A user's JWT keeps the permissions of the
// build that issued it: one denied what Grants allows was issued by an
// older build (see [Allows]).
func Grants(r Role, node, subject string, sub bool, names Names) bool {
	p, err := Permissions(r, node, names)
	if err != nil {
		return false
	}
	if sub {
		return allows(p.Sub, subject)
	}
	return allows(p.Pub, subject)
}

// Allows reports whether p, a user JWT's publish or subscribe permission,
// lets subject through: an allow matches it and no deny does.
func Allows(p jwt.Permission, subject string) bool { return allows(p, subject) }

// allows reports whether p lets subject through: an allow matches it and
// no deny does.
func allows(p jwt.Permission, subject string) bool {
	for _, d := range p.Deny {
		if subjectMatches(d, subject) {
			return false
		}
	}
	for _, a := range p.Allow {
		if subjectMatches(a, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the NATS subject filter f (with * and
// > wildcards) matches the literal subject s.
func subjectMatches(f, s string) bool {
	ft, st := strings.Split(f, "."), strings.Split(s, ".")
	for i, t := range ft {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}
