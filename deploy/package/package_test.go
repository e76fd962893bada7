package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The .deb installs the two binaries, five units and five settings files with
// the modes and owners the units expect; its units pass systemd-analyze
// verify in a scratch root holding the package; the .rpm is written too.
func TestPackages(t *testing.T) {
	dir := t.TempDir()
	bin := meshfoldBinary(t)
	shim := filepath.Join(dir, "meshfold-shim")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-test -X main.commit=0badc0de", "-o", shim, "./cmd/meshfold-shim")
	build.Dir, build.Env = filepath.Join("..", ".."), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build meshfold-shim: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "dist")
	paths, err := Build(Options{Binary: bin, Shim: shim, Version: "v9.8.7-3-gabc1234", Arch: runtime.GOARCH, Out: out, Formats: []string{"deb", "rpm"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || !strings.HasSuffix(paths[0], ".deb") || !strings.HasSuffix(paths[1], ".rpm") {
		t.Fatalf("packages %v", paths)
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil || st.Size() < 1<<20 {
			t.Fatalf("%s: %v, %d bytes", p, err, st.Size())
		}
		t.Logf("%s: %d bytes", filepath.Base(p), st.Size())
	}
	deb := paths[0]
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed: the .deb's contents are not checked")
	}

	// Modes and owners, from the package's own table of contents.
	want := map[string]string{
		"./usr/bin/meshfold":                                   "-rwxr-xr-x root/root",
		"./usr/bin/meshfold-shim":                              "-rwxr-xr-x root/root",
		"./usr/lib/systemd/system/meshfold-serve.service":      "-rw-r--r-- root/root",
		"./usr/lib/systemd/system/meshfold-node@.service":      "-rw-r--r-- root/root",
		"./usr/lib/systemd/system/meshfold-provision@.service": "-rw-r--r-- root/root",
		"./usr/lib/systemd/system/meshfold-reconcile@.service": "-rw-r--r-- root/root",
		"./usr/lib/systemd/system/meshfold-console.service":    "-rw-r--r-- root/root",
		"./etc/meshfold/":                                      "drwxr-xr-x root/root",
		"./etc/meshfold/serve.env":                             "-rw-r--r-- root/root",
		"./etc/meshfold/node.env":                              "-rw-r--r-- root/root",
		"./etc/meshfold/provision.env":                         "-rw-r--r-- root/root",
		"./etc/meshfold/reconcile.env":                         "-rw-r--r-- root/root",
		"./etc/meshfold/console.env":                           "-rw-r--r-- root/root",
	}
	listing, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb -c: %v", err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(listing))
	for sc.Scan() {
		f := strings.Fields(sc.Text()) // mode owner/group size date time path
		if len(f) >= 6 {
			got[f[len(f)-1]] = f[0] + " " + f[1]
		}
	}
	for path, mo := range want {
		if got[path] != mo {
			t.Errorf("%s: %q, want %q", path, got[path], mo)
		}
	}
	for path := range got {
		if _, ok := want[path]; !ok && !strings.HasSuffix(path, "/") {
			t.Errorf("the package also installs %s", path)
		}
	}

	// The maintainer scripts and config files.
	ctl := filepath.Join(dir, "control")
	if out, err := exec.Command("dpkg-deb", "-e", deb, ctl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -e: %v\n%s", err, out)
	}
	postinst, err := os.ReadFile(filepath.Join(ctl, "postinst"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"useradd --system", "systemctl daemon-reload"} {
		if !strings.Contains(string(postinst), w) {
			t.Errorf("postinst lacks %q", w)
		}
	}
	conffiles, _ := os.ReadFile(filepath.Join(ctl, "conffiles"))
	for _, w := range []string{"/etc/meshfold/serve.env", "/etc/meshfold/node.env", "/etc/meshfold/provision.env", "/etc/meshfold/reconcile.env", "/etc/meshfold/console.env"} {
		if !strings.Contains(string(conffiles), w) {
			t.Errorf("conffiles lacks %s", w)
		}
	}
	if fields, err := exec.Command("dpkg-deb", "-f", deb, "Version").Output(); err != nil || strings.TrimSpace(string(fields)) != "9.8.7+git3.abc1234-1" {
		t.Errorf("Version %q, %v", fields, err)
	}

	// Installed into a scratch root: the binary runs and says its version.
	root := filepath.Join(dir, "root")
	if out, err := exec.Command("dpkg", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -x: %v\n%s", err, out)
	}
	v, err := exec.Command(filepath.Join(root, "usr/bin/meshfold"), "version").Output()
	if err != nil || !strings.HasPrefix(string(v), "meshfold v9.8.7-test\ncommit   0badc0de\n") {
		t.Errorf("meshfold version: %v\n%s", err, v)
	}
	// The agent finds meshfold-shim beside itself and asks its protocol.
	v, err = exec.Command(filepath.Join(root, "usr/bin/meshfold-shim"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(v), "meshfold-shim v9.8.7-test commit 0badc0de protocol ") {
		t.Errorf("meshfold-shim --version: %v\n%s", err, v)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the units are not verified")
		return
	}
	// verify checks that ExecStart's binary and the EnvironmentFiles exist:
	// the units are pointed at the scratch root's (the rest of the host's
	// systemd, targets included, is what they are checked against).
	vdir := filepath.Join(dir, "verify")
	if err := os.Mkdir(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"verify", "--man=no"}
	for _, u := range []string{"meshfold-serve.service", "meshfold-node@.service", "meshfold-provision@.service", "meshfold-reconcile@.service", "meshfold-console.service"} {
		b, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", u))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "/usr/bin/meshfold", filepath.Join(root, "usr/bin/meshfold"))
		s = strings.ReplaceAll(s, "=/etc/meshfold/", "="+filepath.Join(root, "etc/meshfold")+"/")
		s = strings.ReplaceAll(s, "=-/etc/meshfold/", "=-"+filepath.Join(root, "etc/meshfold")+"/")
		p := filepath.Join(vdir, strings.Replace(u, "@", "@ace", 1))
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	out2, err := exec.Command(analyze, args...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out2)) > 0 {
		t.Fatalf("systemd-analyze %s: %v\n%s", strings.Join(args, " "), err, out2)
	}
}
