package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/store/storetest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// packScript packs a directory bundle running a script printing word.
func packScript(t *testing.T, word string) (bundle.Packed, []byte) {
	dir := t.TempDir()
	write(t, dir, map[string]string{"meshfold.json": `{"command":["bin/run"],"on_fill":"restart"}`,
		"bin/run*": "#!/bin/sh\necho " + word + "\n"})
	return pack(t, dir)
}

func TestStoreOverEmbeddedServer(t *testing.T) {
	_, _, js := storetest.Start(t)
	ctx := ctxT(t)
	st := bundle.NewStore(js, "")
	if st.Bucket() != "MESH_BUILDS" {
		t.Fatalf("bucket %s", st.Bucket())
	}
	// Nothing pushed: no bucket. List is empty, Open and Remove say so.
	if l, err := st.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("list before any push: %v, %v", l, err)
	}
	p1, d1 := packScript(t, "one")
	if _, _, err := st.Open(ctx, p1.Build); !errors.Is(err, bundle.ErrNoBucket) {
		t.Fatalf("open with no bucket: %v", err)
	}
	if _, err := js.ObjectStore(ctx, "MESH_BUILDS"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("a read created the bucket: %v", err)
	}

	info, existed, err := st.Push(ctx, p1.Build, "one", bytes.NewReader(d1))
	if err != nil || existed || info.Build != p1.Build || info.Size != uint64(len(d1)) || info.From != "one" {
		t.Fatalf("push: %+v %v %v", info, existed, err)
	}
	if _, existed, err := st.Push(ctx, p1.Build, "one", bytes.NewReader(d1)); err != nil || !existed {
		t.Fatalf("second push: existed %v, %v", existed, err)
	}
	// Bytes that are not the build's are refused and not kept.
	p2, d2 := packScript(t, "two")
	if _, _, err := st.Push(ctx, p2.Build, "two", bytes.NewReader(d1)); !errors.Is(err, bundle.ErrMismatch) {
		t.Fatalf("push of other bytes: %v", err)
	}
	if _, _, err := st.Open(ctx, p2.Build); !errors.Is(err, bundle.ErrNotFound) {
		t.Fatalf("the mismatched push was kept: %v", err)
	}
	if _, _, err := st.Push(ctx, "img:sha256:abc", "x", bytes.NewReader(d1)); !errors.Is(err, bundle.ErrNotBundle) {
		t.Fatalf("push of an img build: %v", err)
	}
	if _, _, err := st.Push(ctx, p2.Build, "two", bytes.NewReader(d2)); err != nil {
		t.Fatal(err)
	}

	l, err := st.List(ctx)
	if err != nil || len(l) != 2 {
		t.Fatalf("list: %v %v", l, err)
	}
	builds := []string{l[0].Build, l[1].Build}
	if !slices.Contains(builds, p1.Build) || !slices.Contains(builds, p2.Build) || l[0].Pushed.Before(l[1].Pushed) {
		t.Fatalf("list %+v", l)
	}

	r, _, err := st.Open(ctx, p1.Build)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := got.ReadFrom(r); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if !bytes.Equal(got.Bytes(), d1) {
		t.Fatal("fetched bytes differ from pushed")
	}

	if err := st.Remove(ctx, p2.Build); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove(ctx, p2.Build); !errors.Is(err, bundle.ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if l, _ := st.List(ctx); len(l) != 1 || l[0].Build != p1.Build {
		t.Fatalf("list after remove: %+v", l)
	}
}

func TestCacheOverEmbeddedServer(t *testing.T) {
	_, _, js := storetest.Start(t)
	ctx := ctxT(t)
	st := bundle.NewStore(js, "")
	c, err := bundle.NewCache(filepath.Join(t.TempDir(), "bundles"), st)
	if err != nil {
		t.Fatal(err)
	}
	p1, d1 := packScript(t, "one")
	// No bucket yet: a clear error, and the cache works once it exists.
	if _, _, err := c.Fetch(ctx, p1.Build); !errors.Is(err, bundle.ErrNoBucket) {
		t.Fatalf("fetch with no bucket: %v", err)
	}
	if _, _, err := st.Push(ctx, p1.Build, "one", bytes.NewReader(d1)); err != nil {
		t.Fatal(err)
	}
	dir, m, err := c.Fetch(ctx, p1.Build)
	if err != nil {
		t.Fatal(err)
	}
	if m.Command[0] != "bin/run" || m.OnFill != "restart" {
		t.Fatalf("manifest %+v", m)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "bin/run")); err != nil || string(got) != "#!/bin/sh\necho one\n" {
		t.Fatalf("unpacked %q %v", got, err)
	}
	// Fetched once: removed from the bucket, it is still served.
	if err := st.Remove(ctx, p1.Build); err != nil {
		t.Fatal(err)
	}
	if dir2, _, err := c.Fetch(ctx, p1.Build); err != nil || dir2 != dir {
		t.Fatalf("cached fetch: %s %v", dir2, err)
	}

	// Missing bundle, other schemes.
	p2, d2 := packScript(t, "two")
	if _, _, err := c.Fetch(ctx, p2.Build); !errors.Is(err, bundle.ErrNotFound) {
		t.Fatalf("fetch of a missing bundle: %v", err)
	}
	for _, b := range []string{"img:sha256:" + p2.Build[7:], "src2:9f1c"} {
		if _, _, err := c.Fetch(ctx, b); !errors.Is(err, bundle.ErrNotBundle) {
			t.Fatalf("fetch %s: %v", b, err)
		}
	}

	// A bundle whose content does not match its build (stored around
	// Push): refused before unpacking, nothing kept.
	obs, err := js.ObjectStore(ctx, "MESH_BUILDS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, p2.Build, d1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Fetch(ctx, p2.Build); !errors.Is(err, bundle.ErrMismatch) {
		t.Fatalf("fetch of a mismatched bundle: %v", err)
	}
	if bs, _ := c.Builds(); !slices.Equal(bs, []string{p1.Build}) {
		t.Fatalf("cache holds %v after the mismatch", bs)
	}
	ents, _ := os.ReadDir(c.Dir())
	if len(ents) != 1 {
		t.Fatalf("leftovers in the cache: %v", ents)
	}
	if _, err := obs.PutBytes(ctx, p2.Build, d2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Fetch(ctx, p2.Build); err != nil {
		t.Fatal(err)
	}

	// GC keeps what is in use.
	removed, err := c.GC([]string{p2.Build, "src2:other"})
	if err != nil || !slices.Equal(removed, []string{p1.Build}) {
		t.Fatalf("gc: %v %v", removed, err)
	}
	if bs, _ := c.Builds(); !slices.Equal(bs, []string{p2.Build}) {
		t.Fatalf("after gc: %v", bs)
	}
	if err := c.Prune(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if bs, _ := c.Builds(); len(bs) != 0 {
		t.Fatalf("after prune: %v", bs)
	}
}

func TestCacheClearsLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{".fetch-123", ".unpack-abc", ".remove-x"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bundle.NewCache(dir, nil); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("leftovers kept: %v", ents)
	}
}
