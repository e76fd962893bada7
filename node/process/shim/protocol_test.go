package shim

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A status or spec written before the protocol was recorded is protocol 1:
// the shims of earlier builds speak it, and the runtime adopts them.
func TestNoProtocolIsOne(t *testing.T) {
	var st Status
	if err := json.Unmarshal([]byte(`{"module":"web","build":"sha256:a","state":"running","restarts":0,"since":"2026-12-01T00:00:00Z","shim_pid":7,"shim_start":9}`), &st); err != nil {
		t.Fatal(err)
	}
	if st.Speaks() != 1 {
		t.Errorf("a status without protocol speaks %d, want 1", st.Speaks())
	}
}

// A shim refuses a spec of another protocol before it does anything: no
// shim.json, no socket, exit code 2.
func TestMainRefusesAnotherProtocol(t *testing.T) {
	dir := t.TempDir()
	if err := WriteJSON(dir, SpecFile, Spec{Protocol: Protocol + 1, Module: "web", Argv: []string{"/bin/true"}}); err != nil {
		t.Fatal(err)
	}
	if code := Main(dir); code != 2 {
		t.Errorf("Main of a spec of protocol %d: %d, want 2", Protocol+1, code)
	}
	for _, f := range []string{ShimFile, SockFile, ModuleFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after a refused spec: %v", f, err)
		}
	}
}
