package bundle_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshfold/meshfold/node/bundle"
)

// entry is one tar entry of a hand-made bundle.
type entry struct {
	name string
	typ  byte
	mode int64
	body string
	link string
}

const okManifest = `{"command":["/bin/true"]}`

var manifestEntry = entry{name: bundle.ManifestName, typ: tar.TypeReg, mode: 0o644, body: okManifest}

func tarGz(t *testing.T, es ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestUnpackRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		field   string // a ManifestError's field, else ErrUnsafe
	}{
		{"dot-dot", []entry{manifestEntry, {name: "../escaped", typ: tar.TypeReg, body: "x"}}, ""},
		{"inner dot-dot", []entry{manifestEntry, {name: "a/../../escaped", typ: tar.TypeReg, body: "x"}}, ""},
		{"absolute", []entry{manifestEntry, {name: "/tmp/escaped", typ: tar.TypeReg, body: "x"}}, ""},
		{"absolute link", []entry{manifestEntry, {name: "l", typ: tar.TypeSymlink, link: "/etc"}}, ""},
		{"link out", []entry{manifestEntry, {name: "a/l", typ: tar.TypeSymlink, link: "../../etc"}}, ""},
		{"link through a link", []entry{manifestEntry, {name: "a/up", typ: tar.TypeSymlink, link: ".."},
			{name: "a/l", typ: tar.TypeSymlink, link: "up/../x"}}, ""},
		{"entry under a link", []entry{manifestEntry, {name: "d", typ: tar.TypeDir, mode: 0o755},
			{name: "l", typ: tar.TypeSymlink, link: "d"}, {name: "l/x", typ: tar.TypeReg, body: "x"}}, ""},
		{"hard link", []entry{manifestEntry, {name: "h", typ: tar.TypeLink, link: bundle.ManifestName}}, ""},
		{"char device", []entry{manifestEntry, {name: "null", typ: tar.TypeChar}}, ""},
		{"block device", []entry{manifestEntry, {name: "sda", typ: tar.TypeBlock}}, ""},
		{"fifo", []entry{manifestEntry, {name: "p", typ: tar.TypeFifo}}, ""},
		{"duplicate", []entry{manifestEntry, {name: "a", typ: tar.TypeReg, body: "1"}, {name: "a", typ: tar.TypeReg, body: "2"}}, ""},
		{"no manifest", []entry{{name: "run", typ: tar.TypeReg, mode: 0o755, body: "x"}}, bundle.ManifestName},
		{"manifest is a dir", []entry{{name: bundle.ManifestName + "/", typ: tar.TypeDir, mode: 0o755}}, bundle.ManifestName},
		{"bad manifest", []entry{{name: bundle.ManifestName, typ: tar.TypeReg, body: `{"command":["x"],"nope":1}`}}, bundle.ManifestName},
		{"command missing", []entry{{name: bundle.ManifestName, typ: tar.TypeReg, body: `{"command":["bin/run"]}`}}, "command[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "b")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := bundle.Unpack(bytes.NewReader(tarGz(t, tc.entries...)), dir)
			if tc.field != "" {
				var me *bundle.ManifestError
				if !errors.As(err, &me) || me.Field != tc.field {
					t.Fatalf("err = %v, want a manifest error on %s", err, tc.field)
				}
			} else if !errors.Is(err, bundle.ErrUnsafe) {
				t.Fatalf("err = %v, want ErrUnsafe", err)
			}
			ents, _ := os.ReadDir(parent)
			if len(ents) != 1 {
				t.Fatalf("something was written beside the bundle: %v", ents)
			}
		})
	}
}

func TestUnpackNormalisesModes(t *testing.T) {
	dir := t.TempDir()
	data := tarGz(t, manifestEntry,
		entry{name: "./", typ: tar.TypeDir, mode: 0o777},
		entry{name: "suid", typ: tar.TypeReg, mode: 0o4777, body: "x"},
		entry{name: "plain", typ: tar.TypeReg, mode: 0o666, body: "y"},
		entry{name: "deep/er/file", typ: tar.TypeReg, mode: 0o600, body: "z"},
		entry{name: "deep/link", typ: tar.TypeSymlink, link: "er/file"})
	if _, err := bundle.Unpack(bytes.NewReader(data), dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"suid": 0o755, "plain": 0o644, "deep/er/file": 0o644, "deep": os.ModeDir | 0o755} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "deep/link")); err != nil || string(got) != "z" {
		t.Fatalf("link: %q %v", got, err)
	}
}

func TestUnpackNotGzip(t *testing.T) {
	if _, err := bundle.Unpack(bytes.NewReader([]byte("plain text")), t.TempDir()); !errors.Is(err, bundle.ErrUnsafe) {
		t.Fatalf("err = %v", err)
	}
}
