package auth

import (
	"slices"
	"testing"
)

func TestAllowedRoles(t *testing.T) {
	for _, c := range []struct {
		subject string
		sub     bool
		want    []Role
	}{
		// build push: only the operator creates the builds bucket.
		{"$JS.API.STREAM.CREATE.OBJ_MESH_BUILDS", false, []Role{RoleOperator}},
		{"mesh.ace.want", false, []Role{RoleController}},
		{"mesh.ace.approve", false, []Role{RoleOperator}},
		{"mesh.ace.have", false, []Role{RoleNode}},
		{"mesh.ace.fill", false, []Role{RoleProvisioner}},
		{"$JS.API.STREAM.DELETE.MESH", false, nil},
	} {
		got := AllowedRoles(c.subject, c.sub, Names{})
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.subject, got, c.want)
		}
	}
	for _, c := range []struct {
		f, s string
		ok   bool
	}{{"a.*.c", "a.b.c", true}, {"a.>", "a.b.c", true}, {"a.>", "a", false}, {"a.b", "a.b.c", false}, {"a.*", "a.b.c", false}} {
		if subjectMatches(c.f, c.s) != c.ok {
			t.Errorf("%s ~ %s: %v", c.f, c.s, !c.ok)
		}
	}
}
