package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A unit hardened with ProtectSystem=strict writes nowhere but its
// StateDirectory. The packaged reconcile@ creates its signing key when it is
// missing, so the key its command line names, as systemd expands it from the
// packaged reconcile.env, lies in that directory; it runs in a group, under
// its instance's name. The packaged console listens on loopback: it has no
// login of its own.
func TestReconcileAndConsoleUnits(t *testing.T) {
	none := map[string]string{}
	args := execStart(t, "meshfold-reconcile@.service", none)
	if len(args) < 2 || args[1] != "reconcile" {
		t.Fatalf("meshfold-reconcile@ace runs %q", args)
	}
	if g := flagValue(args, "--group"); g == "" {
		t.Errorf("meshfold-reconcile@ace runs ungrouped: %q", args)
	}
	if i := flagValue(args, "--instance"); i != "ace" {
		t.Errorf("meshfold-reconcile@ace: --instance %q, want the instance's name", i)
	}
	state := unitSetting(t, "meshfold-reconcile@.service", "StateDirectory")
	if state == "" {
		t.Fatal("meshfold-reconcile@.service has no StateDirectory")
	}
	key := lastFlagValue(args, "--signing-key")
	if dir := filepath.Join("/var/lib", state); filepath.Dir(key) != dir {
		t.Errorf("meshfold-reconcile@ace signs with %q, outside its StateDirectory %s (ProtectSystem=strict: it could not create it)", key, dir)
	}
	if unitSetting(t, "meshfold-reconcile@.service", "ProtectSystem") != "strict" {
		t.Error("meshfold-reconcile@.service: ProtectSystem is not strict")
	}

	args = execStart(t, "meshfold-console.service", none)
	if len(args) < 2 || args[1] != "console" {
		t.Fatalf("meshfold-console runs %q", args)
	}
	host, _, err := net.SplitHostPort(lastFlagValue(args, "--listen"))
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Errorf("meshfold-console listens on %q (%v), want loopback", lastFlagValue(args, "--listen"), err)
	}
	for _, u := range []string{"meshfold-reconcile@.service", "meshfold-console.service"} {
		if got := unitSetting(t, u, "User"); got != "meshfold" {
			t.Errorf("%s runs as %q, want the package's user meshfold", u, got)
		}
	}
}

// unitSetting returns the last value of key in the packaged unit, or "".
func unitSetting(t *testing.T, unit, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("files", unit))
	if err != nil {
		t.Fatal(err)
	}
	var v string
	for _, line := range strings.Split(string(b), "\n") {
		if val, ok := strings.CutPrefix(line, key+"="); ok {
			v = val
		}
	}
	return v
}

// lastFlagValue is flagValue for the last --name in args: the one the
// command keeps.
func lastFlagValue(args []string, name string) string {
	for i := len(args) - 1; i >= 0; i-- {
		if v := flagValue(args[i:], name); v != "" {
			return v
		}
	}
	return ""
}
