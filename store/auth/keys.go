package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshfold/meshfold/store"
)

// The reconciler's signing key in an auth directory (issue 14; see
// docs/operations.md, "Signed plans and knocks"):
//
//	reconciler-signing.nk    0600  the seed that signs every plan and knock
//	reconciler-retired.pub   0644  public keys it signed with before a rotation
//	reconcilers.pub          0644  the keys node agents and provisioners trust:
//	                               the current one, and the previous one
//	                               during a rotation's overlap
const (
	SigningKeyFile  = "reconciler-signing.nk"
	RetiredKeysFile = "reconciler-retired.pub"
	TrustFile       = "reconcilers.pub"
)

// SigningKeyPath returns the path of the reconciler's signing seed.
func (d *Dir) SigningKeyPath() string { return filepath.Join(d.path, SigningKeyFile) }

// TrustPath returns the path of the trust file: copy it to every node,
// beside its creds, and pass it to node and provision with --trust.
func (d *Dir) TrustPath() string { return filepath.Join(d.path, TrustFile) }

// ensureSigningKey creates the signing key when missing and the trust
// file when missing (naming the current key).
func (d *Dir) ensureSigningKey() (string, error) {
	kp, _, err := store.LoadOrCreateSigningKey(d.SigningKeyPath())
	if err != nil {
		return "", err
	}
	pub, _ := kp.PublicKey()
	if _, err := os.Stat(d.TrustPath()); errors.Is(err, fs.ErrNotExist) {
		if err := store.WriteTrustFile(d.TrustPath(), pub); err != nil {
			return "", err
		}
	}
	return pub, nil
}

// RotateReconciler replaces the reconciler's signing key. With finish
// false it creates a new key, adds the old public key to the retired
// keys (the reconciler's own, for folding its older plans) and writes a
// trust file naming the new key and the old one retired until overlap
// from now: the overlap, during which agents that have the new trust file
// accept plans signed by either key, the old key's never over a plan of
// the new one (docs/architecture.md, "Trust per deployment"). Copy the
// trust file to every node and restart their agents and provisioners,
// then restart the reconcilers with the new seed. With finish true it
// writes a trust file naming the current key alone, ending the overlap.
// It returns the keys the trust file names now, the current first, and
// when the overlap ends (zero with finish).
//
// Errors: a missing or unreadable key; I/O errors.
func (d *Dir) RotateReconciler(finish bool, overlap time.Duration) ([]string, time.Time, error) {
	if _, err := d.ensureSigningKey(); err != nil {
		return nil, time.Time{}, err
	}
	return RotateKeys(d.path, finish, overlap)
}

// RotateKeys is [Dir.RotateReconciler] of any directory that holds the
// reconciler's seed ([SigningKeyFile]) beside its retired keys and its
// trust file: an auth directory, or the data directory of a `serve`
// without --auth, which keeps the same three files (a fresh user's
// finding U12: such a serve had no way to rotate its key but to lose it).
//
// Errors: a missing or unreadable seed; I/O errors.
func RotateKeys(dir string, finish bool, overlap time.Duration) ([]string, time.Time, error) {
	seedPath, trustPath := filepath.Join(dir, SigningKeyFile), filepath.Join(dir, TrustFile)
	if _, err := os.Stat(seedPath); err != nil {
		return nil, time.Time{}, fmt.Errorf("signing key: %w", err)
	}
	kp, _, err := store.LoadOrCreateSigningKey(seedPath)
	if err != nil {
		return nil, time.Time{}, err
	}
	old, _ := kp.PublicKey()
	if finish {
		return []string{old}, time.Time{}, store.WriteTrustFile(trustPath, old)
	}
	retired := []string{old}
	if t, err := store.ReadTrustFile(filepath.Join(dir, RetiredKeysFile)); err == nil {
		retired = append(t.Keys(), old)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, time.Time{}, err
	}
	kp, err = store.NewSigningKey()
	if err != nil {
		return nil, time.Time{}, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	until := time.Now().Add(overlap).UTC().Truncate(time.Second)
	trust, err := store.NewTrust(pub)
	if err == nil {
		trust, err = trust.Retire(old, until)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	if err := store.WriteTrustFile(filepath.Join(dir, RetiredKeysFile), retired...); err != nil {
		return nil, time.Time{}, err
	}
	if err := writeFile(seedPath, append(seed, '\n'), 0o600); err != nil {
		return nil, time.Time{}, fmt.Errorf("signing key: %w", err)
	}
	return []string{pub, old}, until, store.WriteTrust(trustPath, trust)
}
