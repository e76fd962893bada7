package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// Signed effects (docs/architecture.md, "Signed effects"): the reconciler
// signs plans and knocks with its signing key; node agents and
// provisioners verify them against a trust file of public keys.
const (
	// signingKeyFile is the reconciler's seed, beside its other keys;
	// retiredKeysFile lists the public keys it signed with before a
	// rotation (its own, for folding older plans).
	signingKeyFile  = auth.SigningKeyFile
	retiredKeysFile = auth.RetiredKeysFile
	// trustFileName is the trust file of node agents and provisioners.
	trustFileName = auth.TrustFile
)

// stateBase is meshfold's per-machine state directory: $XDG_STATE_HOME/
// meshfold when set, else /var/lib/meshfold as root, else
// ~/.local/state/meshfold.
func stateBase() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "meshfold"), nil
	}
	if os.Geteuid() == 0 {
		return "/var/lib/meshfold", nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory (%v): set XDG_STATE_HOME", err)
	}
	return filepath.Join(home, ".local", "state", "meshfold"), nil
}

// defaultTrustFile is where serve adds its public key and local node
// agents and provisioners read the keys they trust: the keys of every
// serve started on this machine (without --auth).
func defaultTrustFile() (string, error) {
	base, err := stateBase()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, trustFileName), nil
}

// reconcilerKeys loads (creating it when missing) the signing key at
// seedPath and the retired public keys beside it, and returns the signer
// and the keys whose plans count as the reconciler's own.
func reconcilerKeys(seedPath string) (*store.Signer, *store.Trust, bool, error) {
	kp, created, err := store.LoadOrCreateSigningKey(seedPath)
	if err != nil {
		return nil, nil, false, err
	}
	signer, err := store.NewSigner(kp)
	if err != nil {
		return nil, nil, false, err
	}
	own := []string{signer.PublicKey()}
	retired, err := store.ReadTrustFile(filepath.Join(filepath.Dir(seedPath), retiredKeysFile))
	switch {
	case err == nil:
		own = append(own, retired.Keys()...)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, false, err
	}
	trust, err := store.NewTrust(own...)
	return signer, trust, created, err
}

// trustFlag is --trust of node and provision.
type trustFlag struct{ path string }

func (f *trustFlag) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "trust", "", "file of the reconciler public keys whose plans and knocks are trusted, one a line (default: the file every meshfold serve started on this machine adds its key to, $XDG_STATE_HOME/meshfold/"+trustFileName+", /var/lib/meshfold/"+trustFileName+" as root); in a mesh with an auth directory, its "+trustFileName+" copied to the node")
}

// load reads the trust file.
func (f *trustFlag) load() (*store.Trust, error) {
	path := f.path
	if path == "" {
		var err error
		if path, err = defaultTrustFile(); err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("--trust: %w", err))
		}
	}
	t, err := store.ReadTrustFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, withCode(exitUsage, fmt.Errorf("--trust: no trusted reconciler keys at %s: start meshfold serve on this machine first, or pass the reconciler's %s with --trust", path, trustFileName))
	}
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--trust: %w", err))
	}
	return t, nil
}

// publishTrust adds the signer's public key to the machine's default trust
// file at path, for the node agents and provisioners of this machine: the
// keys of the other serves started here stay (docs/architecture.md,
// "Signed effects"). It returns the keys the file lists.
func publishTrust(path string, signer *store.Signer) ([]string, error) {
	return store.AddTrustFile(path, signer.PublicKey())
}
