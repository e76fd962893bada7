package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// The version and commit the tests link in, as the Dockerfile's build
// arguments would.
const (
	testVersion = "v9.8.7-test"
	testCommit  = "0badc0de"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  string
	buildDir  string
)

// meshfoldBinary builds meshfold once per test binary, by running
// deploy/Dockerfile's own go build line (its build arguments substituted,
// its output redirected), and returns the binary's path.
func meshfoldBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		line, err := dockerfileBuildLine()
		if err != nil {
			buildErr = err.Error()
			return
		}
		buildDir, err = os.MkdirTemp("", "meshfold-dockerfile-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		bin := filepath.Join(buildDir, "meshfold")
		line = strings.NewReplacer("${VERSION}", testVersion, "${COMMIT}", testCommit, "-o /out/meshfold", "-o "+bin).Replace(line)
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = filepath.Join("..", "..") // the Dockerfile's WORKDIR holds the repository
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = "RUN " + line + ": " + err.Error() + "\n" + string(out)
			return
		}
		builtBin = bin
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var goBuildRun = regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .*-o /out/meshfold \./cmd/meshfold)$`)

func dockerfileBuildLine() (string, error) {
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		return "", err
	}
	m := goBuildRun.FindSubmatch(b)
	if m == nil {
		return "", os.ErrNotExist
	}
	return string(m[1]), nil
}

// deploy/Dockerfile builds a static binary (no interpreter, no shared
// libraries: it runs on an empty base) with its version and commit, and its
// final stage is scratch, run as a non-root user. The image itself needs a
// container engine, which the test suite does not assume.
func TestDockerfileBuild(t *testing.T) {
	bin := meshfoldBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the binary is dynamically linked (%v)", p.Type)
		}
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "meshfold "+testVersion+"\ncommit   "+testCommit+"\n") {
		t.Fatalf("meshfold version: %v\n%s", err, out)
	}

	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	final := df[strings.LastIndex(df, "\nFROM "):]
	for _, want := range []string{"\nFROM scratch\n", "\nUSER 65532:65532\n", "\nENTRYPOINT [\"/usr/bin/meshfold\"]\n"} {
		if !strings.Contains(final, want) {
			t.Errorf("the final stage lacks %q", strings.TrimSpace(want))
		}
	}

	c, err := os.ReadFile(filepath.Join("..", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	compose := string(c)
	for _, want := range []string{"\n  n1:\n", "\n  n2:\n", "\n  n3:\n", `"--instance", "r1"`, `"--instance", "r2"`, "\n  console:\n", "dockerfile: deploy/Dockerfile"} {
		if !strings.Contains(compose, want) {
			t.Errorf("compose.yaml lacks %q", want)
		}
	}
	if n := strings.Count(compose, `"--group", "reconcilers"`); n != 2 {
		t.Errorf("compose.yaml: %d grouped reconcilers, want 2", n)
	}
}
