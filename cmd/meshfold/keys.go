package main

import (
	"errors"
	"fmt"
	"io/fs"
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

// trustFlag is --trust and --trust-from of node and provision: the
// keys a role trusts are exactly those it was given, never a file that
// another deployment on the machine writes (issue 24).
type trustFlag struct{ path, from string }

func (f *trustFlag) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "trust", "", "file of the reconciler public keys whose plans and knocks are trusted, one a line: an auth directory's "+trustFileName+" copied to the node ('meshfold auth add-node' prints its path)")
	cmd.Flags().StringVar(&f.from, "trust-from", "", "trust the keys of the meshfold serve whose --data (or --auth) directory is DIR: DIR/"+trustFileName+", which serve writes at start")
	cmd.MarkFlagsMutuallyExclusive("trust", "trust-from")
}

// load reads the trust file the flags name and returns it with the path
// it came from.
func (f *trustFlag) load() (*store.Trust, string, error) {
	path := f.path
	switch {
	case f.from != "":
		path = filepath.Join(f.from, trustFileName)
	case path == "":
		return nil, "", withCode(exitUsage, errors.New("no trusted reconciler keys: pass --trust-from DIR, DIR the data (or auth) directory of the meshfold serve beside it, or --trust FILE, the reconcilers' public keys (an auth directory's "+trustFileName+")"))
	}
	t, err := store.ReadTrustFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if f.from != "" {
			return nil, "", withCode(exitUsage, fmt.Errorf("--trust-from %s: no %s there: start meshfold serve --data %s first (it writes its public key there)", f.from, trustFileName, f.from))
		}
		return nil, "", withCode(exitUsage, fmt.Errorf("--trust: %w", err))
	}
	if err != nil {
		return nil, "", withCode(exitUsage, fmt.Errorf("--trust: %w", err))
	}
	return t, path, nil
}

// sayTrust prints, when a role starts, which reconciler keys it trusts
// and where it read them.
func sayTrust(a *app, role string, t *store.Trust, path string) {
	fmt.Fprintf(a.stdout, "meshfold: %s trusts plans and knocks signed by %s (from %s)\n", role, t, path)
}
