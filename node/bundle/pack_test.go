package bundle_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/node/bundle"
)

// write makes files under dir: name → content; a name ending in "*" is
// made executable (the star is dropped), "@target" content makes a link.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mode := os.FileMode(0o644)
		if n, ok := strings.CutSuffix(name, "*"); ok {
			name, mode = n, 0o755
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "@"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func pack(t *testing.T, src string) (bundle.Packed, []byte) {
	t.Helper()
	var b bytes.Buffer
	p, err := bundle.Pack(src, &b)
	if err != nil {
		t.Fatalf("pack %s: %v", src, err)
	}
	return p, b.Bytes()
}

// entries lists a bundle's tar headers.
func entries(t *testing.T, data []byte) []*tar.Header {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

const script = "#!/bin/sh\necho hi\n"

func TestPackDeterministic(t *testing.T) {
	files := map[string]string{
		"meshfold.json": `{"command":["bin/run"]}`, "bin/run*": script, "lib/a.txt": "a", "lib/b": "@a.txt", "z": "z",
	}
	a, b := t.TempDir(), t.TempDir()
	write(t, a, files)
	write(t, b, files)
	// Different times and modes of the same content pack the same.
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(b, "z"), old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(b, "z"), 0o600); err != nil {
		t.Fatal(err)
	}
	pa, da := pack(t, a)
	pb, db := pack(t, b)
	if pa.Build != pb.Build || !bytes.Equal(da, db) {
		t.Fatalf("same content, builds %s and %s", pa.Build, pb.Build)
	}
	if pa.Build != bundle.BuildOf(da) || pa.Size != int64(len(da)) {
		t.Fatalf("build %s size %d, bytes hash to %s, %d bytes", pa.Build, pa.Size, bundle.BuildOf(da), len(da))
	}
	if _, err := bundle.ParseBuild(pa.Build); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range entries(t, da) {
		names = append(names, h.Name)
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: time %v owner %d:%d %q:%q", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if h.Name == "z" && h.Mode != 0o644 {
			t.Errorf("z mode %o, want 0644", h.Mode)
		}
		if h.Name == "bin/run" && h.Mode != 0o755 {
			t.Errorf("bin/run mode %o, want 0755", h.Mode)
		}
	}
	want := "bin/ bin/run lib/ lib/a.txt lib/b meshfold.json z"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("entries %q, want %q", got, want)
	}
	// One byte more changes the build.
	write(t, b, map[string]string{"z": "zz"})
	if pc, _ := pack(t, b); pc.Build == pa.Build {
		t.Fatal("different content, same build")
	}
}

func TestPackExecutable(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{"mbg*": script})
	p, data := pack(t, filepath.Join(dir, "mbg"))
	if !p.Generated || len(p.Manifest.Command) != 1 || p.Manifest.Command[0] != "mbg" {
		t.Fatalf("packed %+v", p)
	}
	out := t.TempDir()
	m, err := bundle.Unpack(bytes.NewReader(data), out)
	if err != nil {
		t.Fatal(err)
	}
	if m.Command[0] != "mbg" {
		t.Fatalf("manifest %+v", m)
	}
	got, err := os.ReadFile(filepath.Join(out, "mbg"))
	if err != nil || string(got) != script {
		t.Fatalf("unpacked %q, %v", got, err)
	}
	if fi, _ := os.Stat(filepath.Join(out, "mbg")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if p2, _ := pack(t, filepath.Join(dir, "mbg")); p2.Build != p.Build {
		t.Fatal("the same executable packed twice gives two builds")
	}
}

func TestPackRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		path  string // under the dir; "" is the dir
		field string // a ManifestError's field, else ErrPack
	}{
		{"not executable", map[string]string{"run": script}, "run", ""},
		{"no manifest", map[string]string{"run*": script}, "", ""},
		{"manifest is a link", map[string]string{"m": `{"command":["/bin/true"]}`, "meshfold.json": "@m"}, "", ""},
		{"unknown field", map[string]string{"meshfold.json": `{"command":["/bin/true"],"stop_sig":"x"}`}, "", bundle.ManifestName},
		{"empty command", map[string]string{"meshfold.json": `{"command":[]}`}, "", "command"},
		{"bad signal", map[string]string{"meshfold.json": `{"command":["/bin/true"],"stop_signal":"SIGNOPE"}`}, "", "stop_signal"},
		{"command missing", map[string]string{"meshfold.json": `{"command":["bin/run"]}`}, "", "command[0]"},
		{"command not executable", map[string]string{"meshfold.json": `{"command":["run"]}`, "run": script}, "", "command[0]"},
		{"absolute link", map[string]string{"meshfold.json": `{"command":["/bin/true"]}`, "l": "@/etc/passwd"}, "", ""},
		{"link out", map[string]string{"meshfold.json": `{"command":["/bin/true"]}`, "d/l": "@../../x"}, "", ""},
		{"link through a link", map[string]string{"meshfold.json": `{"command":["/bin/true"]}`, "d/up": "@..", "d/l": "@up/../x"}, "", ""},
		{"missing path", nil, "nope", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, tc.files)
			var out bytes.Buffer
			_, err := bundle.Pack(filepath.Join(dir, tc.path), &out)
			if tc.field != "" {
				var me *bundle.ManifestError
				if !errors.As(err, &me) || me.Field != tc.field {
					t.Fatalf("err = %v, want a manifest error on %s", err, tc.field)
				}
			} else if !errors.Is(err, bundle.ErrPack) {
				t.Fatalf("err = %v, want ErrPack", err)
			}
			if out.Len() != 0 {
				t.Fatalf("%d bytes written before the refusal", out.Len())
			}
		})
	}
}

func TestPackRefusesFifo(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{"meshfold.json": `{"command":["/bin/true"]}`})
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Skip("mkfifo:", err)
	}
	_, err := bundle.Pack(dir, io.Discard)
	if !errors.Is(err, bundle.ErrPack) || !strings.Contains(err.Error(), "named pipe") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseBuild(t *testing.T) {
	good := bundle.BuildOf([]byte("x"))
	for _, tc := range []struct {
		build string
		err   error
	}{
		{good, nil},
		{"img:sha256:" + strings.Repeat("a", 64), bundle.ErrNotBundle},
		{"src2:9f1c", bundle.ErrNotBundle},
		{"", bundle.ErrNotBundle},
		{"sha256:abc", bundle.ErrBadBuild},
		{"sha256:" + strings.Repeat("A", 64), bundle.ErrBadBuild},
		{"sha256:" + strings.Repeat("g", 64), bundle.ErrBadBuild},
	} {
		_, err := bundle.ParseBuild(tc.build)
		if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("ParseBuild(%q) = %v, want %v", tc.build, err, tc.err)
		}
	}
	if got := bundle.Short(good); len(got) != len("sha256:")+12 {
		t.Errorf("Short = %q", got)
	}
}
