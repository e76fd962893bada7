package saferoot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// nobody is the uid a module account's directories are given here.
const nobody = 65534

// needRoot skips a test that chowns to another uid unless it runs as
// root (CI does).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chowns directories to uid 65534")
	}
}

// tree makes the directories, files ("name=content") and symlinks
// ("name->target") of spec under root, in order, and chowns the
// directories named in owned to nobody.
func tree(t *testing.T, root string, spec []string, owned ...string) {
	t.Helper()
	for _, s := range spec {
		switch {
		case strings.Contains(s, "->"):
			name, target, _ := strings.Cut(s, "->")
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				t.Fatal(err)
			}
		case strings.Contains(s, "="):
			name, content, _ := strings.Cut(s, "=")
			if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.MkdirAll(filepath.Join(root, s), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range owned {
		if err := os.Lchown(filepath.Join(root, d), nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
}

// resolved is the path of the directory d holds, as the kernel names it.
func resolved(t *testing.T, d *Dir) string {
	t.Helper()
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", d.fd))
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return p
}

// A symlink on the way is followed only in a directory no one but root
// could have written; ".." and absolute targets stay inside the root.
func TestParent(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name   string
		spec   []string
		owned  []string
		chmod  map[string]fs.FileMode
		path   string
		want   string // the parent, under the root; "" when refused
		errIs  error
		errMsg string
	}{
		{name: "plain", spec: []string{"srv/nb"}, path: "srv/nb/tok", want: "srv/nb"},
		{name: "the root itself", path: "tok", want: ""},
		{name: "a module-owned dir is entered", spec: []string{"srv/nb/sub"}, owned: []string{"srv/nb", "srv/nb/sub"},
			path: "srv/nb/sub/tok2", want: "srv/nb/sub"},
		{name: "the tester's link: refused", spec: []string{"etc/cron.d", "srv/nb", "srv/nb/sub->../../etc/cron.d"},
			owned: []string{"srv/nb"}, path: "srv/nb/sub/tok2", errIs: ErrNotFollowed,
			errMsg: `component "sub" is a symlink in a directory writable by uid 65534: not followed`},
		{name: "a link in a module-owned dir to its own dir: refused too", spec: []string{"srv/nb/real", "srv/nb/sub->real"},
			owned: []string{"srv/nb", "srv/nb/real"}, path: "srv/nb/sub/tok", errIs: ErrNotFollowed},
		{name: "host link in a root 0755 dir: followed", spec: []string{"run/app", "var", "var/run->../run"},
			path: "var/run/app/tok", want: "run/app"},
		{name: "absolute host link inside the root: followed", spec: []string{"run/app", "var", "var/run->ROOT/run"},
			path: "var/run/app/tok", want: "run/app"},
		{name: "a link in a world-writable sticky dir: refused", spec: []string{"etc", "tmp", "tmp/x->../etc"},
			chmod: map[string]fs.FileMode{"tmp": 0o777 | fs.ModeSticky}, path: "tmp/x/tok", errIs: ErrNotFollowed,
			errMsg: `component "x" is a symlink in a directory writable by group or others (mode 1777): not followed`},
		{name: "a link in a group-writable root dir: refused", spec: []string{"etc", "opt", "opt/x->../etc"},
			chmod: map[string]fs.FileMode{"opt": 0o775}, path: "opt/x/tok", errIs: ErrNotFollowed},
		{name: "a trusted link to a module-owned dir holding a planted one", spec: []string{"etc", "srv/nb", "srv/nb/sub->../../etc", "data->srv/nb"},
			owned: []string{"srv/nb"}, path: "data/sub/tok", errIs: ErrNotFollowed},
		{name: "dotdot past the root", spec: []string{"a", "a/up->../.."}, path: "a/up/x/tok", errIs: ErrEscapes},
		{name: "absolute link out of the root", spec: []string{"a", "a/out->/etc"}, path: "a/out/tok", errIs: ErrEscapes},
		{name: "a file on the way", spec: []string{"a", "a/f=x"}, path: "a/f/tok", errIs: unix.ENOTDIR},
		{name: "a loop", spec: []string{"a", "a/l->l"}, path: "a/l/tok", errIs: unix.ELOOP},
		{name: "missing", spec: []string{"a"}, path: "a/b/tok", errIs: fs.ErrNotExist},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.Chmod(root, 0o755); err != nil {
				t.Fatal(err)
			}
			spec := make([]string, len(c.spec))
			for i, s := range c.spec {
				spec[i] = strings.ReplaceAll(s, "ROOT", root)
			}
			tree(t, root, spec, c.owned...)
			for d, m := range c.chmod {
				if err := os.Chmod(filepath.Join(root, d), m); err != nil {
					t.Fatal(err)
				}
			}
			r, err := Open(root)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			d, base, err := r.Parent(c.path, false)
			if c.errIs != nil {
				if err == nil {
					d.Close()
					t.Fatalf("resolved to %s, want an error matching %v", resolved(t, d), c.errIs)
				}
				if !errors.Is(err, c.errIs) {
					t.Fatalf("error %v, want one matching %v", err, c.errIs)
				}
				if c.errMsg != "" && err.Error() != c.errMsg {
					t.Errorf("error %q, want %q", err, c.errMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if base != filepath.Base(c.path) {
				t.Errorf("base %q", base)
			}
			if got, want := resolved(t, d), filepath.Join(root, c.want); got != want {
				t.Errorf("resolved to %s, want %s", got, want)
			}
		})
	}
}

// With create, missing directories are made 0755 through the held
// descriptors, inside a module-owned directory too; never through a
// planted link.
func TestParentCreates(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	tree(t, root, []string{"etc/cron.d", "srv/nb", "srv/nb/sub->../../etc/cron.d"}, "srv/nb")
	r, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, _, err := r.Parent("srv/nb/new/deep/tok", true)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	fi, err := os.Stat(filepath.Join(root, "srv/nb/new/deep"))
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o755 != 0 {
		t.Fatalf("made %v, %v; want a directory of at most 0755", fi, err)
	}
	if _, _, err := r.Parent("srv/nb/sub/made/tok", true); !errors.Is(err, ErrNotFollowed) {
		t.Fatalf("through the planted link: %v, want ErrNotFollowed", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "etc/cron.d")); len(ents) != 0 {
		t.Errorf("a directory was made through the planted link: %v", ents)
	}
}

// A Dir's methods never follow a symlink at the name they are given, and
// a Dir keeps the directory it resolved: a component swapped for a
// symlink afterwards redirects nothing.
func TestDirNoFollow(t *testing.T) {
	root := t.TempDir()
	victim := t.TempDir()
	tree(t, root, []string{"app", "app/link->" + filepath.Join(victim, "secret")})
	if err := os.WriteFile(filepath.Join(victim, "secret"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, base, err := r.Parent("app/link", false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.OpenFile(base, os.O_RDONLY, 0); !errors.Is(err, unix.ELOOP) {
		t.Errorf("open of a symlink: %v, want ELOOP", err)
	}
	if fi, err := d.Lstat(base); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("lstat of a symlink: %v, %v", fi, err)
	}
	if err := os.WriteFile(filepath.Join(root, "app/new"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Rename("new", base); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(victim, "secret")); string(got) != "root's" {
		t.Errorf("the rename wrote through the symlink: %q", got)
	}
	if err := os.Symlink(filepath.Join(victim, "secret"), filepath.Join(root, "app/link2")); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("link2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(victim, "secret")); err != nil {
		t.Errorf("the remove deleted the symlink's target: %v", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if _, err := d.OpenFile(bad, os.O_RDONLY, 0); err == nil {
			t.Errorf("OpenFile(%q) succeeded", bad)
		}
	}

	// app swapped for a link to victim after the walk: d still holds app.
	if err := os.Rename(filepath.Join(root, "app"), filepath.Join(root, "app.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(root, "app")); err != nil {
		t.Fatal(err)
	}
	f, err := d.OpenFile("tok", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := os.Stat(filepath.Join(victim, "tok")); err == nil {
		t.Error("a file was made through the swapped-in link")
	}
	if _, err := os.Stat(filepath.Join(root, "app.old/tok")); err != nil {
		t.Errorf("the file is not in the held directory: %v", err)
	}
}

// Names lists the directory; Sync syncs it.
func TestDirNamesSync(t *testing.T) {
	root := t.TempDir()
	tree(t, root, []string{"a", "a/x=1", "a/y=2"})
	r, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, _, err := r.Parent("a/z", false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	names, err := d.Names()
	if err != nil || len(names) != 2 {
		t.Fatalf("names %v, %v", names, err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if d.Name() != "/a" {
		t.Errorf("name %q, want /a", d.Name())
	}
}

// BenchmarkLook is the look at one filled file in place, a path of three
// components (/run/app/token), as the agent's checkFiles makes it every
// interval per declared file: the walk and fstatat here, os.Root's Lstat
// (what it was) beside it. Run it on the file system that matters:
// TMPDIR decides.
func BenchmarkLook(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run/app"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run/app/token"), []byte("x"), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Run("saferoot", func(b *testing.B) {
		r, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		for b.Loop() {
			d, base, err := r.Parent("run/app/token", false)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Lstat(base); err != nil {
				b.Fatal(err)
			}
			d.Close()
		}
	})
	b.Run("os.Root", func(b *testing.B) {
		r, err := os.OpenRoot(dir)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		for b.Loop() {
			if _, err := r.Lstat("run/app/token"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
