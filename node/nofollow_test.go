package node

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/saferoot"
)

// The tests here are a fresh tester's G1: a module account that owns its
// data directory replaces a directory on a filled file's path with a
// symlink into a root-only one; the root agent, whose --root is / in the
// packaged unit, so every link stays inside it, then wrote the file there
// (and made directories there), and deleted a root-owned file of that
// name at a want change. They chown directories to nobody, as the module
// account, so they run as root (CI does).

// notFollowed is the reason a fill through the planted link is refused.
const notFollowed = `component "sub" is a symlink in a directory writable by uid 65534: not followed`

// moduleOwned makes dir under root (and its parents, root-owned 0755)
// and gives dir to nobody, as a module account's data directory.
func moduleOwned(t *testing.T, root, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a directory of nobody's, as a module account's, and a root agent")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	p := filepath.Join(root, dir)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return p
}

// plant replaces name with a symlink to target, owned by nobody, as the
// module account would.
func plant(t *testing.T, name, target string) {
	t.Helper()
	if err := os.RemoveAll(name); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(name, 65534, 65534); err != nil {
		t.Fatal(err)
	}
}

// A fill through a symlink the module account planted in its own
// directory is refused as write-failed, naming the link; nothing is made
// in the directory it points to. The module's other file, in the
// directory it owns, is filled as before.
func TestFillRefusesPlantedLink(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	nb := moduleOwned(t, a.root, "srv/nb")
	cron := filepath.Join(a.root, "etc/cron.d")
	if err := os.MkdirAll(cron, 0o755); err != nil {
		t.Fatal(err)
	}
	plant(t, filepath.Join(nb, "sub"), "../../etc/cron.d")
	m2 := events.PlanModule{Name: "m2", Build: "m:1", RunsAs: "nobody", Files: []events.File{
		{Path: "/srv/nb/tok", Mode: "0600"}, {Path: "/srv/nb/sub/tok2", Mode: "0600"}, {Path: "/srv/nb/sub/deep/tok3", Mode: "0600"}}}
	p := e.publishPlan(t, "ace", "prov", m2)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))

	if r, _ := e.fill(t, "ace", "m2", "/srv/nb/tok", "prov", []byte(secret)); !r.OK {
		t.Fatalf("fill of the module's own directory: %+v", r)
	}
	for _, path := range []string{"/srv/nb/sub/tok2", "/srv/nb/sub/deep/tok3"} {
		r, _ := e.fill(t, "ace", "m2", path, "prov", []byte(secret))
		checkRefusal(t, e, r, "ace", "m2", path, "prov", events.ReasonWriteFailed, p)
		if want := path + ": " + notFollowed; r.Error != want {
			t.Errorf("refusal error %q, want %q", r.Error, want)
		}
	}
	if ents, _ := os.ReadDir(cron); len(ents) != 0 {
		t.Errorf("the root agent made %d entries in etc/cron.d through the planted link", len(ents))
	}
	if !logged(a.logs.String(), `level=WARN`, `msg="fill refused"`, `path=/srv/nb/sub/tok2`, strconvQuote(notFollowed)) {
		t.Errorf("the agent's log does not say why:\n%s", a.logs.String())
	}
	assertNoLeak(t, e.js, e.cfg.Name, a.logs.String())
}

// A filled file whose directory the module account replaced with a
// symlink into a root-only directory is not deleted there when the want
// drops it, nor when the module is retired: the delete is refused at
// WARN, naming the link, and the path stays on record.
func TestDeleteRefusesPlantedLink(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	nb := moduleOwned(t, a.root, "srv/nb")
	important := filepath.Join(a.root, "etc/important")
	if err := os.MkdirAll(important, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(important, "tok2")
	if err := os.WriteFile(victim, []byte("root's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := []events.File{{Path: "/srv/nb/tok", Mode: "0600"}, {Path: "/srv/nb/sub/tok2", Mode: "0600"}}
	m2 := events.PlanModule{Name: "m2", Build: "m:1", RunsAs: "nobody", Files: files}
	p1 := e.publishPlan(t, "ace", "prov", m2)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	for _, f := range files {
		if r, _ := e.fill(t, "ace", "m2", f.Path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("fill %s: %+v", f.Path, r)
		}
	}
	plant(t, filepath.Join(nb, "sub"), "../../etc/important")

	// The want drops /srv/nb/sub/tok2.
	m2.Files = files[:1]
	p2 := e.publishPlan(t, "ace", "prov", m2)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	if got, err := os.ReadFile(victim); err != nil || string(got) != "root's own" {
		t.Fatalf("root's file after the want dropped the path: %q, %v", got, err)
	}
	if !logged(a.logs.String(), `level=WARN`, `msg="filled file no longer declared not deleted"`, `path=/srv/nb/sub/tok2`, strconvQuote(notFollowed)) {
		t.Errorf("no WARN naming the link:\n%s", a.logs.String())
	}
	if rec := a.loadFiles()["m2"]; len(rec) != 2 {
		t.Errorf("on record for m2: %v, want both paths (the refused delete kept)", rec)
	}

	// The module retired: its files go, but not through the link.
	p3 := e.publishPlan(t, "ace", "prov")
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p3))
	if got, err := os.ReadFile(victim); err != nil || string(got) != "root's own" {
		t.Fatalf("root's file after the module's removal: %q, %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(nb, "tok")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the module's own file after its removal: %v, want it deleted", err)
	}
	if !logged(a.logs.String(), `level=WARN`, `msg="filled file of a removed module not deleted"`, `path=/srv/nb/sub/tok2`, strconvQuote(notFollowed)) {
		t.Errorf("no WARN naming the link at the removal:\n%s", a.logs.String())
	}
	assertNoLeak(t, e.js, e.cfg.Name, a.logs.String())
}

// logged reports whether a line of logs holds every one of parts.
func logged(logs string, parts ...string) bool {
	for line := range strings.Lines(logs) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// strconvQuote is s as slog's text handler writes it inside a quoted
// value: its quotes escaped.
func strconvQuote(s string) string { q := strconv.Quote(s); return q[1 : len(q)-1] }

// rootOf opens dir as the agent's root for the unit tests below.
func rootOf(t *testing.T, dir string) *saferoot.Root {
	t.Helper()
	r, err := saferoot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// modeOwner is a file's permission bits and owner.
func modeOwner(t *testing.T, p string) (fs.FileMode, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid
}

// A plan's owner and mode change is not made through a planted
// directory link (refitFile: chown and chmod through an O_NOFOLLOW
// descriptor of the file the safe walk reached), nor on a file with a
// second hard link, nor through a symlink at the file; a root-owned
// directory's link is followed as before.
func TestRefitDoesNotFollow(t *testing.T) {
	dir := t.TempDir()
	nb := moduleOwned(t, dir, "srv/nb")
	important := filepath.Join(dir, "etc/important")
	if err := os.MkdirAll(important, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(important, "tok")
	if err := os.WriteFile(victim, []byte("root's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := rootOf(t, dir)
	refit := func(p string) (bool, error) {
		return refitFile(root, events.File{Path: p, Mode: "0644"}, "nobody")
	}
	unchanged := func(why string) {
		t.Helper()
		if mode, uid := modeOwner(t, victim); mode != 0o600 || uid != 0 {
			t.Fatalf("%s: root's file is now %v uid %d", why, mode, uid)
		}
	}

	plant(t, filepath.Join(nb, "sub"), "../../etc/important")
	if changed, err := refit("/srv/nb/sub/tok"); changed || !errors.Is(err, saferoot.ErrNotFollowed) {
		t.Errorf("through a planted directory link: changed %v, %v; want ErrNotFollowed", changed, err)
	}
	unchanged("a refit through a planted directory link")

	plant(t, filepath.Join(nb, "tok"), "../../etc/important/tok")
	if changed, err := refit("/srv/nb/tok"); changed || err != nil {
		t.Errorf("a symlink at the file: changed %v, %v; want it left alone", changed, err)
	}
	unchanged("a refit of a symlink at the file")

	if err := os.Remove(filepath.Join(nb, "tok")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(victim, filepath.Join(nb, "tok")); err != nil {
		t.Fatal(err)
	}
	if changed, err := refit("/srv/nb/tok"); changed || err == nil || !strings.Contains(err.Error(), "2 hard links") {
		t.Errorf("a hard link to root's file: changed %v, %v; want refused", changed, err)
	}
	unchanged("a refit of a hard link")

	// A link in a root-owned 0755 directory is followed: /var/run -> /run.
	if err := os.MkdirAll(filepath.Join(dir, "run/app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run/app/token"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run", filepath.Join(dir, "var/run")); err != nil {
		t.Fatal(err)
	}
	if changed, err := refit("/var/run/app/token"); !changed || err != nil {
		t.Errorf("through a root-owned directory's link: changed %v, %v; want the refit made", changed, err)
	}
	if mode, uid := modeOwner(t, filepath.Join(dir, "run/app/token")); mode != 0o644 || uid != 65534 {
		t.Errorf("after the refit: %v uid %d, want 0644 uid 65534", mode, uid)
	}
}

// A write is not made through a planted directory link, and goes through
// a root-owned directory's; sameFile and the look at files in place do
// not take a file reached through a planted link as the declared one.
func TestWriteLookThroughLinks(t *testing.T) {
	dir := t.TempDir()
	nb := moduleOwned(t, dir, "srv/nb")
	important := filepath.Join(dir, "etc/important")
	if err := os.MkdirAll(important, 0o700); err != nil {
		t.Fatal(err)
	}
	root := rootOf(t, dir)
	file := events.File{Path: "/srv/nb/sub/tok", Mode: "0600"}
	key := []byte("0123456789abcdef0123456789abcdef")
	content := []byte(secret)
	// Root's own file of the name, with the content a fill would write.
	if err := os.WriteFile(filepath.Join(important, "tok"), content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(important, "tok"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	plant(t, filepath.Join(nb, "sub"), "../../etc/important")
	if sameFile(root, file, "nobody", key, digest(key, content)) {
		t.Error("sameFile took root's file through the planted link as the filled one")
	}
	if err := lookFile(root, file.Path); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, saferoot.ErrNotFollowed) {
		t.Errorf("the look through the planted link: %v, want gone (and not followed)", err)
	}
	if err := writeFile(root, file, "nobody", []byte("new")); !errors.Is(err, saferoot.ErrNotFollowed) {
		t.Errorf("write through the planted link: %v, want ErrNotFollowed", err)
	}
	if got, _ := os.ReadFile(filepath.Join(important, "tok")); string(got) != secret {
		t.Error("the write reached root's file")
	}
	if err := removeFile(root, file.Path); !errors.Is(err, saferoot.ErrNotFollowed) {
		t.Errorf("delete through the planted link: %v, want ErrNotFollowed", err)
	}

	// The same through a link in a root-owned 0755 directory: followed.
	if err := os.Symlink("srv/nb", filepath.Join(dir, "data")); err != nil {
		t.Fatal(err)
	}
	ok := events.File{Path: "/data/tok", Mode: "0600"}
	if err := writeFile(root, ok, "nobody", content); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(nb, "tok")); string(got) != secret {
		t.Errorf("the write through a root-owned directory's link: %q", got)
	}
	if !sameFile(root, ok, "nobody", key, digest(key, content)) {
		t.Error("sameFile through a root-owned directory's link said no")
	}
	if err := lookFile(root, ok.Path); err != nil {
		t.Errorf("look: %v", err)
	}
	if err := removeFile(root, ok.Path); err != nil {
		t.Errorf("delete: %v", err)
	}
}

// The first look at the files in place does not take a file reached
// through a planted directory link as present: it is gone at the start,
// and the have says so.
func TestStartLookThroughPlantedLink(t *testing.T) {
	dir := t.TempDir()
	nb := moduleOwned(t, dir, "srv/nb")
	if err := os.MkdirAll(filepath.Join(dir, "etc/important"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/important/tok"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	plant(t, filepath.Join(nb, "sub"), "../../etc/important")
	a := &Agent{root: rootOf(t, dir), lookAll: true, log: slog.New(slog.DiscardHandler),
		settled: &events.Plan{Modules: []events.PlanModule{{Name: "m2", Build: "m:1", RunsAs: "nobody",
			Files: []events.File{{Path: "/srv/nb/sub/tok", Mode: "0600"}}}}}}
	if !a.checkFiles() {
		t.Fatal("the first look took the file through the planted link as present")
	}
	running := []events.HaveModule{{Name: "m2", Build: "m:1", State: events.Running}}
	if got := a.missingFiles(running); len(got) != 1 || !got[0].AtStart {
		t.Errorf("the have reports %v, want the file gone at the start", got)
	}
}

// A symlink swapped in for the file between refitFile's look (regular)
// and its change is not followed: the chown and chmod are made through
// a descriptor opened O_NOFOLLOW, which the swap makes fail, so the file
// is left alone. By name (Lstat, then Chmod and Lchown, as before) the
// chmod went through the link to root's file.
func TestRefitSwapNotFollowed(t *testing.T) {
	dir := t.TempDir()
	nb := moduleOwned(t, dir, "srv/nb")
	victim := filepath.Join(dir, "etc/important/tok")
	if err := os.MkdirAll(filepath.Dir(victim), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, []byte("root's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nb, "tok"), []byte("filled"), 0o600); err != nil {
		t.Fatal(err)
	}
	swapped := false
	openFilledHook = func(p string) {
		if p == "/srv/nb/tok" {
			plant(t, filepath.Join(nb, "tok"), "../../etc/important/tok")
			swapped = true
		}
	}
	t.Cleanup(func() { openFilledHook = nil })
	changed, err := refitFile(rootOf(t, dir), events.File{Path: "/srv/nb/tok", Mode: "0644"}, "nobody")
	if !swapped {
		t.Fatal("the swap was not made: the hook was not called")
	}
	if changed || err != nil {
		t.Errorf("refit after the swap: changed %v, %v; want the file left alone", changed, err)
	}
	if mode, uid := modeOwner(t, victim); mode != 0o600 || uid != 0 {
		t.Errorf("root's file after a refit through a swapped-in link: %v uid %d", mode, uid)
	}
}
