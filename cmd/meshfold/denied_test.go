package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/store/auth"
)

// A verb a role may not publish is refused naming the verb's own right
// and the roles that have it, in one line, even when the server refused
// a read the verb makes before its publish first (a fresh user's finding
// V4: a controller's approve and pause named the retire they read and
// "the roles operator, operator-read, reconciler", as if operator-read
// could approve; retire printed "not published: context canceled" above
// the refusal).
func TestDeniedVerbNamesItsRight(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := newNoteBuffer()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"}, nil, out, out)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	out.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(out.String())[1]
	as := func(user string) []string { return []string{"--server", url, "--creds", d.CredsPath(user)} }

	if code, _, errs := runCLI(ctx, append([]string{"want", "ace", "--new", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"web:3","requires_approval":true}]}`)}, as("controller")...)...); code != exitOK {
		t.Fatalf("want as controller: %d %s", code, errs)
	}
	creds := d.CredsPath("controller")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"approve", "ace", "web", "web:4", "--by", "x"}, "permission denied: the controller role may not approve (publish to mesh.ace.approve); only the operator role may"},
		{[]string{"approve", "--all", "web", "web:4", "--by", "x"}, "permission denied: the controller role may not approve (publish to mesh.*.approve); only the operator role may"},
		{[]string{"pause", "ace", "--by", "x"}, "permission denied: the controller role may not pause (publish to mesh.ace.pause); only the operator role may"},
		{[]string{"retire", "ace", "--by", "x"}, "permission denied: the controller role may not retire (publish to mesh.ace.retire); only the operator role may"},
		// apply starts a rollout, an operator's act: its reads before
		// (a direct get of a node's agent event) are refused the
		// controller first, and the error named operator-read (a fresh
		// user's finding F2).
		{[]string{"apply", "-f", writeFleet(t, fleetYAML), "--by", "x"}, "permission denied: the controller role may not apply (publish to mesh.rollout.web.start); only the operator role may"},
	} {
		code, _, errs := runCLI(ctx, append(tc.args, as("controller")...)...)
		if code != exitError || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) ||
			!strings.Contains(errs, "the creds given ("+creds+") are user controller's, of the controller role") {
			t.Errorf("%s as controller: exit %d, stderr %q; want exit %d and one line with %q", strings.Join(tc.args, " "), code, errs, exitError, tc.want)
		}
	}
	// A dry run of apply publishes nothing: operator-read runs it.
	if code, out, errs := runCLI(ctx, append([]string{"apply", "-f", writeFleet(t, fleetYAML), "--dry-run", "--new"}, as("operator-read")...)...); code != exitOK {
		t.Errorf("apply --dry-run as operator-read: exit %d, %s%s", code, out, errs)
	}
	// A role that may read what the verb reads is refused at the publish
	// itself: the same words.
	if code, _, errs := runCLI(ctx, append([]string{"poke", "ace", "--by", "x"}, as("operator-read")...)...); code != exitError || strings.Count(errs, "\n") != 1 ||
		!strings.Contains(errs, "permission denied: the operator-read role may not poke (publish to mesh.ace.poke); only the operator role may") {
		t.Errorf("poke as operator-read: exit %d, stderr %q", code, errs)
	}
}

// A command that returns the server's permission violation itself (a
// publish store's guard failed at once) before the connection's error
// handler kept it for run is explained all the same: under load a denied
// poke printed the raw "nats: permissions violation: Permissions
// Violation for Publish to ..." (TestRevokedRolesExit).
func TestDenialExplainedWhenTheCommandSawItFirst(t *testing.T) {
	t.Parallel()
	root, a := newRootApp(nil, nil, nil)
	cmd, rest, err := root.Find([]string{"poke", "ace", "--by", "x", "--new"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatal(err)
	}
	violation := fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Publish to "mesh.ace.poke"`)
	cmdErr := fmt.Errorf("poke ace: append: %w", violation)
	d := a.commandDenied(cmdErr)
	if d == nil {
		t.Fatalf("the command's own permission violation (%v) is not taken as its denial", cmdErr)
	}
	if got := a.explainDenied(cmd, d).Error(); !strings.Contains(got, "permission denied: these credentials may not poke (publish to mesh.ace.poke); only the operator role may") {
		t.Errorf("explained: %s", got)
	}
	if d := a.commandDenied(errors.New("poke ace: context deadline exceeded")); d != nil {
		t.Errorf("another error taken as a denial: %v", d)
	}
}

// Creds whose own user this build grants what the server denied were
// issued by an older build (a JWT's permissions are fixed at issue): the
// refusal says so and how to issue them again, instead of "only the
// operator role may" to an operator (operator creds issued before approval
// gates are denied mesh.*.gate; seen live on the approvals2 branch).
func TestDeniedToItsOwnRoleSaysIssueAgain(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The operator's creds as a build before gates issued them: this
	// build's permissions without the gate subject.
	perms, err := auth.Permissions(auth.RoleOperator, "", auth.Names{})
	if err != nil {
		t.Fatal(err)
	}
	perms.Pub.Allow = slices.DeleteFunc(slices.Clone(perms.Pub.Allow), func(s string) bool { return strings.HasSuffix(s, ".gate") })
	older := filepath.Join(t.TempDir(), "operator-older.creds")
	writeCreds(t, older, "operator", perms)

	violation := fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Publish to "mesh.ace.gate"`)
	explain := func(creds string) string {
		t.Helper()
		root, a := newRootApp(nil, nil, nil)
		cmd, rest, err := root.Find([]string{"ungate", "ace", "db", "--by", "x", "--creds", creds})
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatal(err)
		}
		return a.explainDenied(cmd, a.commandDenied(violation)).Error()
	}
	got := explain(older)
	for _, want := range []string{
		"permission denied: these credentials may not publish to mesh.ace.gate",
		"the operator role may in this build, but the creds given (" + older + ", user operator's) were issued by an older build",
		"meshfold auth revoke operator --dir DIR, then meshfold auth add-user operator --dir DIR",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("explained:\n\t%s\nwant it to hold %q", got, want)
		}
	}
	// Creds of this build, of a role that may not, keep the usual words;
	// so do a node's provisioner's asking for another node's subject,
	// which its role may for that node only.
	if code, _, errs := runCLI(ctx, "auth", "add-node", "ace", "--dir", dir); code != exitOK {
		t.Fatalf("auth add-node: %d %s", code, errs)
	}
	for _, c := range []struct{ user, subject string }{
		{"controller", "mesh.ace.gate"},
		{"provisioner-ace", "$KV.MESH_NODES.bob.provisioner"},
	} {
		violation = fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, c.subject)
		if got := explain(d.CredsPath(c.user)); strings.Contains(got, "older build") || !strings.Contains(got, "connect with such a user's creds") {
			t.Errorf("%s denied %s, explained: %s", c.user, c.subject, got)
		}
	}
}

// writeCreds writes a creds file of a user named name with perms, signed
// by a fresh account key: what credsUser and issuedWithout read (the
// server, which checks the signature, never sees it).
func writeCreds(t *testing.T, path, name string, perms jwt.Permissions) {
	t.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	useed, err := ukp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Permissions = perms
	tok, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(tok, useed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
}
