package saferoot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// kernelDir is the directory the kernel resolves p to (every symlink
// followed), by its /proc name, or "" when it resolves to none.
func kernelDir(p string) string {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	got, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return ""
	}
	return got
}

// On random trees of directories, files and symlinks, some directories
// a module account's (nobody's, or world-writable): the walk resolves
// exactly what the kernel resolves once every symlink in such a
// directory is deleted, when that is a directory inside the root, and
// fails otherwise, with ErrNotFollowed when the kernel would have
// crossed one of those links. So it follows no link a module account
// could have planted, follows every other, and never leaves the root.
func TestParentMatchesKernelWithoutUntrustedLinks(t *testing.T) {
	needRoot(t)
	if _, err := os.Readlink("/proc/self/fd/0"); err != nil {
		t.Skip("no /proc/self/fd")
	}
	base := t.TempDir()
	n := 0
	seen := map[string]int{}
	kinds := []string{"resolved", "refused, where the kernel would have gone", "escapes"}
	covered := func() bool {
		for _, k := range kinds {
			if seen[k] == 0 {
				return false
			}
		}
		return true
	}
	// An escape is rare among the generated trees (none in 100 about one
	// run in eight): the property is checked again, up to 10 times 100
	// trees, until every kind of case has been met.
	for range 10 {
		if covered() || t.Failed() {
			break
		}
		checkParentAgainstKernel(t, base, &n, seen)
	}
	t.Logf("cases: %v", seen)
	for _, k := range kinds {
		if seen[k] == 0 {
			t.Errorf("no case %s: the generator misses it", k)
		}
	}
}

// checkParentAgainstKernel runs the property of
// TestParentMatchesKernelWithoutUntrustedLinks once (rapid's 100 trees),
// counting the kinds of case met in seen.
func checkParentAgainstKernel(t *testing.T, base string, n *int, seen map[string]int) {
	rapid.Check(t, func(rt *rapid.T) {
		*n++
		root := filepath.Join(base, fmt.Sprint(*n), "r")
		if err := os.MkdirAll(root, 0o755); err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(filepath.Dir(root))
		names := []string{"a", "b", "c"}
		targets := []string{"a", "b", ".", "..", "../a", "../b/a", "../c/b", "../..", "../../..", "/etc", root, root + "/a", root + "/b/c", "c/../a", "../a/b/.."}
		// a is root's, b nobody's, c world-writable and sticky (/tmp);
		// each holds a, b and c: a directory (its parent's owner's), a
		// symlink or nothing.
		untrusted := []string{filepath.Join(root, "b"), filepath.Join(root, "c")} // directories a module account could write
		for _, top := range names {
			if err := os.Mkdir(filepath.Join(root, top), 0o755); err != nil {
				rt.Fatal(err)
			}
			for _, n := range names {
				p := filepath.Join(root, top, n)
				switch rapid.IntRange(0, 2).Draw(rt, top+"/"+n) {
				case 0:
					if err := os.Mkdir(p, 0o755); err != nil {
						rt.Fatal(err)
					}
					if top == "b" {
						_ = os.Lchown(p, nobody, nobody)
						untrusted = append(untrusted, p)
					}
				case 1:
					if err := os.Symlink(rapid.SampledFrom(targets).Draw(rt, top+"/"+n+" ->"), p); err != nil {
						rt.Fatal(err)
					}
				}
			}
		}
		if err := os.Lchown(untrusted[0], nobody, nobody); err != nil {
			rt.Fatal(err)
		}
		if err := os.Chmod(untrusted[1], 0o777|os.ModeSticky); err != nil {
			rt.Fatal(err)
		}
		query := strings.Join(rapid.SliceOfN(rapid.SampledFrom(names), 2, 4).Draw(rt, "query"), "/")

		r, err := Open(root)
		if err != nil {
			rt.Fatal(err)
		}
		defer r.Close()
		d, _, err := r.Parent(query+"/f", false)
		var got string
		if err == nil {
			got = fmt.Sprintf("/proc/self/fd/%d", d.fd)
			got, _ = os.Readlink(got)
			d.Close()
		}
		full := kernelDir(filepath.Join(root, query))

		// Every symlink in a directory a module account could write
		// deleted: what the kernel resolves then is what may be reached.
		for _, u := range untrusted {
			ents, _ := os.ReadDir(u)
			for _, e := range ents {
				if e.Type()&os.ModeSymlink != 0 {
					_ = os.Remove(filepath.Join(u, e.Name()))
				}
			}
		}
		want := kernelDir(filepath.Join(root, query))
		if want != root && !strings.HasPrefix(want, root+"/") {
			want = ""
		}
		if got != want {
			rt.Fatalf("%s: the walk gives %q (%v), the kernel without untrusted links %q", query, got, err, want)
		}
		if errors.Is(err, ErrNotFollowed) && want != "" {
			rt.Fatalf("%s: refused a link, yet reachable without one", query)
		}
		switch {
		case err == nil:
			seen["resolved"]++
		case errors.Is(err, ErrNotFollowed) && full != "":
			seen["refused, where the kernel would have gone"]++
		case errors.Is(err, ErrNotFollowed):
			seen["refused"]++
		case errors.Is(err, ErrEscapes):
			seen["escapes"]++
		default:
			seen["other errors"]++
		}
	})
}
