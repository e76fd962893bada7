package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/node/process/shim"
)

// The agent's shim command: MESHFOLD_SHIM's meshfold-shim when it speaks
// this build's protocol, refused otherwise; without it (and none beside
// the test binary) this executable as `meshfold shim`.
func TestShimCommand(t *testing.T) {
	// Not parallel: t.Setenv.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), shimBinary)); err == nil {
		t.Skip("a meshfold-shim lies beside the test binary")
	}
	log := slog.New(slog.DiscardHandler)
	t.Setenv(shimEnv, "")
	if got, err := shimCommand(log); err != nil || !slices.Equal(got, []string{exe, "shim"}) {
		t.Errorf("without a meshfold-shim: %q, %v; want %q", got, err, []string{exe, "shim"})
	}

	fake := filepath.Join(t.TempDir(), shimBinary)
	says := func(line string) {
		t.Helper()
		if err := os.WriteFile(fake, []byte("#!/bin/sh\necho '"+line+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(shimEnv, fake)
	says("meshfold-shim v1.2.3 commit abc protocol " + strconv.Itoa(shim.Protocol))
	if got, err := shimCommand(log); err != nil || !slices.Equal(got, []string{fake}) {
		t.Errorf("a meshfold-shim of this protocol: %q, %v", got, err)
	}
	says("meshfold-shim v9.0.0 commit def protocol 99")
	if _, err := shimCommand(log); err == nil || !strings.Contains(err.Error(), "speaks protocol 99") {
		t.Errorf("a meshfold-shim of protocol 99: %v, want it refused", err)
	}
	says("something else")
	if _, err := shimCommand(log); err == nil || !strings.Contains(err.Error(), "not a meshfold-shim") {
		t.Errorf("not a meshfold-shim: %v, want it refused", err)
	}
	t.Setenv(shimEnv, filepath.Join(t.TempDir(), "missing"))
	if _, err := shimCommand(log); err == nil {
		t.Error("MESHFOLD_SHIM naming no file: accepted")
	}
}
