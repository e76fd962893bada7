package main

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

//go:embed files
var embedded embed.FS

// Options says what Build packages and where.
type Options struct {
	Binary  string   // path of the meshfold binary
	Shim    string   // path of the meshfold-shim binary (the node agent's per-module supervisor)
	Version string   // git describe output; see pkgVersion
	Arch    string   // GOARCH of the binary
	Out     string   // directory the packages are written to (created)
	Formats []string // "deb", "rpm"
}

// unitDir is where both formats install the units: /usr/lib/systemd/system
// is systemd's package unit directory on Debian (merged /usr) and on RPM
// distributions alike.
const unitDir = "/usr/lib/systemd/system"

// Build writes one package per format into o.Out and returns their paths.
func Build(o Options) ([]string, error) {
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.Shim); err != nil {
		return nil, fmt.Errorf("the shim binary: %w", err)
	}
	src, err := os.MkdirTemp("", "meshfold-package-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	err = fs.WalkDir(embedded, "files", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := embedded.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(src, d.Name()), b, 0o644)
	})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for _, format := range o.Formats {
		format = strings.TrimSpace(format)
		if format == "" {
			continue
		}
		p, err := buildOne(o, src, format)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", format, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func buildOne(o Options, src, format string) (string, error) {
	f := func(name string) string { return filepath.Join(src, name) }
	root := func(mode os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode}
	}
	version, meta := pkgVersion(o.Version)
	info := &nfpm.Info{
		Name:            "meshfold",
		Arch:            o.Arch,
		Platform:        "linux",
		Version:         version,
		VersionSchema:   "none",
		VersionMetadata: meta,
		Release:         "1",
		Section:         "admin",
		Priority:        "optional",
		Maintainer:      "meshfold maintainers <meshfold@users.noreply.github.com>",
		Description:     "meshfold: declarative fleet reconciler over NATS JetStream (server, reconciler, node agent, provisioner, console, CLI)",
		Vendor:          "meshfold",
		Homepage:        "https://github.com/meshfold/meshfold",
		MTime:           time.Unix(0, 0).UTC(),
		Overridables: nfpm.Overridables{
			Contents: files.Contents{
				{Source: o.Binary, Destination: "/usr/bin/meshfold", FileInfo: root(0o755)},
				{Source: o.Shim, Destination: "/usr/bin/meshfold-shim", FileInfo: root(0o755)},
				{Source: f("meshfold-serve.service"), Destination: unitDir + "/meshfold-serve.service", FileInfo: root(0o644)},
				{Source: f("meshfold-node@.service"), Destination: unitDir + "/meshfold-node@.service", FileInfo: root(0o644)},
				{Source: f("meshfold-provision@.service"), Destination: unitDir + "/meshfold-provision@.service", FileInfo: root(0o644)},
				{Source: f("meshfold-reconcile@.service"), Destination: unitDir + "/meshfold-reconcile@.service", FileInfo: root(0o644)},
				{Source: f("meshfold-console.service"), Destination: unitDir + "/meshfold-console.service", FileInfo: root(0o644)},
				{Destination: "/etc/meshfold", Type: files.TypeDir, FileInfo: root(0o755)},
				{Source: f("serve.env"), Destination: "/etc/meshfold/serve.env", Type: files.TypeConfigNoReplace, FileInfo: root(0o644)},
				{Source: f("node.env"), Destination: "/etc/meshfold/node.env", Type: files.TypeConfigNoReplace, FileInfo: root(0o644)},
				{Source: f("provision.env"), Destination: "/etc/meshfold/provision.env", Type: files.TypeConfigNoReplace, FileInfo: root(0o644)},
				{Source: f("reconcile.env"), Destination: "/etc/meshfold/reconcile.env", Type: files.TypeConfigNoReplace, FileInfo: root(0o644)},
				{Source: f("console.env"), Destination: "/etc/meshfold/console.env", Type: files.TypeConfigNoReplace, FileInfo: root(0o644)},
			},
			Scripts: nfpm.Scripts{
				PostInstall: f("postinstall.sh"),
				PostRemove:  f("postremove.sh"),
			},
			Recommends: []string{"systemd"},
		},
	}
	if err := nfpm.PrepareForPackager(nfpm.WithDefaults(info), format); err != nil {
		return "", err
	}
	packager, err := nfpm.Get(format)
	if err != nil {
		return "", err
	}
	path := filepath.Join(o.Out, packager.ConventionalFileName(info))
	w, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := packager.Package(info, w); err != nil {
		w.Close()
		os.Remove(path)
		return "", err
	}
	return path, w.Close()
}

var releaseTag = regexp.MustCompile(`^v?([0-9]+\.[0-9]+\.[0-9]+)(?:-([0-9]+)-g([0-9a-f]+))?(-dirty)?$`)

// pkgVersion maps git describe output to a version both formats accept:
// v1.2.3 → 1.2.3; v1.2.3-4-gabc → 1.2.3 with metadata git4.abc (sorts
// after 1.2.3); a bare commit or anything else → 0.0.0 with metadata
// git.<it>; -dirty adds .dirty.
func pkgVersion(v string) (version, meta string) {
	v = strings.TrimSpace(v)
	if m := releaseTag.FindStringSubmatch(v); m != nil {
		version = m[1]
		if m[2] != "" {
			meta = "git" + m[2] + "." + m[3]
		}
		if m[4] != "" {
			meta = strings.TrimPrefix(meta+".dirty", ".")
		}
		return version, meta
	}
	clean := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '.' {
			return r
		}
		return '.'
	}, v)
	if clean == "" {
		clean = "unknown"
	}
	return "0.0.0", "git." + clean
}
