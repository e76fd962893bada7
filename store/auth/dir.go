package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
	"github.com/meshfold/meshfold/store"
)

// Sentinel errors.
var (
	// ErrExists: Init was asked to write into a directory that is not
	// empty (without Force), or that is not an auth directory (even with
	// Force: Init never deletes what it did not write).
	ErrExists = errors.New("auth: the directory exists and is not empty")
	// ErrNotAuthDir: Open found no auth.json in the directory.
	ErrNotAuthDir = errors.New("auth: not a meshfold auth directory (no auth.json): run `meshfold auth init` first")
	// ErrUserExists: AddNode found both users of the node valid. Revoke
	// one first to issue it again: a re-issued key must not leave the old
	// one valid.
	ErrUserExists = errors.New("auth: the user exists and is not revoked")
	// ErrUnknownUser: no user of that name in the directory.
	ErrUnknownUser = errors.New("auth: no such user")
	// ErrSystemUser: Revoke was asked to revoke the system user, the one
	// that pushes revocations. Rotate it with every other key: Init with
	// Force.
	ErrSystemUser = errors.New("auth: the system user cannot be revoked: it pushes the revocations (replace the whole directory with auth init --force to rotate it)")
	// ErrUnknownRole: a role this package does not know.
	ErrUnknownRole = errors.New("auth: unknown role")
	// ErrReservedName: AddOperator was asked for a name whose user name
	// another user has by role ("read": operator-read).
	ErrReservedName = errors.New("auth: reserved name")
)

// Account names, as the account JWTs carry them.
const (
	SystemAccountName = "SYS"
	MeshAccountName   = "MESH"
	operatorName      = "meshfold"
)

// File layout of an auth directory (mode 0700, every file 0600 but the
// JWTs and resolver.conf, which hold no secret and are 0644):
//
//	auth.json                   the metadata: names, public keys, users
//	operator.jwt, operator.nk   the operator's JWT and seed
//	accounts/<NAME>.jwt, .nk    each account's JWT and seed (SYS, MESH)
//	creds/<user>.creds          each user's credentials (JWT and seed)
//	resolver.conf               the operator and accounts for an external
//	                            nats-server (see docs/operations.md)
const (
	metaFile     = "auth.json"
	operatorJWT  = "operator.jwt"
	operatorSeed = "operator.nk"
	accountsDir  = "accounts"
	credsDir     = "creds"
	resolverFile = "resolver.conf"
	metaVersion  = 1
)

// Limits are the mesh account's JetStream limits, in bytes and counts;
// -1 means unlimited. Zero fields take the defaults of [DefaultLimits].
type Limits struct {
	DiskStorage   int64 `json:"disk_storage"`
	MemoryStorage int64 `json:"memory_storage"`
	Streams       int64 `json:"streams"`
	Consumers     int64 `json:"consumers"`
}

// DefaultLimits: unlimited storage (the stream keeps all history for
// audit; cap it with the stream's own --max-bytes or here), 8 streams
// (meshfold makes 2: the event stream and the snapshot bucket), and
// unlimited consumers (a node agent and a provisioner each hold one
// ordered consumer, the reconciler one or two per partition, every
// reader one while it reads).
var DefaultLimits = Limits{DiskStorage: -1, MemoryStorage: -1, Streams: 8, Consumers: -1}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.DiskStorage != 0 {
		d.DiskStorage = l.DiskStorage
	}
	if l.MemoryStorage != 0 {
		d.MemoryStorage = l.MemoryStorage
	}
	if l.Streams != 0 {
		d.Streams = l.Streams
	}
	if l.Consumers != 0 {
		d.Consumers = l.Consumers
	}
	return d
}

// Config configures [Init].
type Config struct {
	// Names are the stream and prefix the permissions are written for.
	Names Names
	// Limits are the mesh account's JetStream limits.
	Limits Limits
	// Force lets Init replace an existing auth directory (one with an
	// auth.json): its operator, accounts and credentials are replaced,
	// and every credential issued from it stops working.
	Force bool
}

// User is one issued user.
type User struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
	// Node is the node of a node or provisioner user.
	Node string `json:"node,omitempty"`
	// Operator is the name of a named operator ([Dir.AddOperator]);
	// empty for the shared operator user.
	Operator string `json:"operator,omitempty"`
	// PublicKey is the user's NKey (U...).
	PublicKey string `json:"public_key"`
	// Account is the public key of the user's account.
	Account string    `json:"account"`
	Issued  time.Time `json:"issued"`
	// Revoked is when the user was revoked; nil while it is valid.
	Revoked *time.Time `json:"revoked,omitempty"`
}

// meta is auth.json.
type meta struct {
	V        int              `json:"v"`
	Names    Names            `json:"names"`
	Operator string           `json:"operator"`
	System   string           `json:"system_account"`
	Account  string           `json:"account"`
	Users    map[string]*User `json:"users"`
}

// Dir is an auth directory: the operator, the system and mesh accounts,
// and the users issued so far. It is not safe for concurrent use, nor for
// two processes changing the same directory at once.
type Dir struct {
	path string
	m    meta
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// Names returns the stream and prefix the permissions are written for.
func (d *Dir) Names() Names { return d.m.Names }

// SystemAccount and Account return the public keys (A...) of the system
// account and of the mesh account.
func (d *Dir) SystemAccount() string { return d.m.System }

// Account returns the public key of the mesh account.
func (d *Dir) Account() string { return d.m.Account }

// Operator returns the operator's public key (O...).
func (d *Dir) Operator() string { return d.m.Operator }

// CredsPath returns the path of user's creds file (which may not exist).
func (d *Dir) CredsPath(user string) string {
	return filepath.Join(d.path, credsDir, user+".creds")
}

// User returns the user named name.
//
// Errors: [ErrUnknownUser].
func (d *Dir) User(name string) (User, error) {
	u, ok := d.m.Users[name]
	if !ok {
		return User{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
	}
	return *u, nil
}

// Users returns every user issued, sorted by name.
func (d *Dir) Users() []User {
	out := make([]User, 0, len(d.m.Users))
	for _, u := range d.m.Users {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b User) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Init creates an auth directory at path: an operator, a system account
// with its user "sys", a mesh account with JetStream enabled within
// cfg.Limits, and the users reconciler, controller and operator, each with
// a creds file. The directory is made with mode 0700, seeds and creds
// with 0600; auth.json is written last, so a directory without it is an
// unfinished one.
//
// Errors: [ErrExists] when path exists and is not empty (unless
// cfg.Force and it is an auth directory); invalid names; I/O errors.
func Init(path string, cfg Config) (*Dir, error) {
	names := cfg.Names.withDefaults()
	if err := names.validate(); err != nil {
		return nil, err
	}
	if err := prepare(path, cfg.Force); err != nil {
		return nil, err
	}
	d := &Dir{path: path, m: meta{V: metaVersion, Names: names, Users: map[string]*User{}}}

	op, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	sys, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	acc, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	d.m.Operator, _ = op.PublicKey()
	d.m.System, _ = sys.PublicKey()
	d.m.Account, _ = acc.PublicKey()

	oc := jwt.NewOperatorClaims(d.m.Operator)
	oc.Name = operatorName
	oc.SystemAccount = d.m.System
	ojwt, err := oc.Encode(op)
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	if err := writeSeed(filepath.Join(path, operatorSeed), op); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(path, operatorJWT), []byte(ojwt), 0o644); err != nil {
		return nil, err
	}

	sc := jwt.NewAccountClaims(d.m.System)
	sc.Name = SystemAccountName
	ac := jwt.NewAccountClaims(d.m.Account)
	ac.Name = MeshAccountName
	l := cfg.Limits.withDefaults()
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{DiskStorage: l.DiskStorage, MemoryStorage: l.MemoryStorage,
		Streams: l.Streams, Consumer: l.Consumers, MaxAckPending: -1}
	for _, a := range []struct {
		kp nkeys.KeyPair
		c  *jwt.AccountClaims
	}{{sys, sc}, {acc, ac}} {
		if err := writeSeed(filepath.Join(path, accountsDir, a.c.Name+".nk"), a.kp); err != nil {
			return nil, err
		}
		if err := d.signAccount(op, a.c); err != nil {
			return nil, err
		}
	}
	for _, r := range initRoles {
		if _, err := d.issue(r, ""); err != nil {
			return nil, err
		}
	}
	if _, err := d.ensureSigningKey(); err != nil {
		return nil, err
	}
	if err := d.save(); err != nil {
		return nil, err
	}
	return d, nil
}

// initRoles are the roles of one user each that [Init] issues.
var initRoles = []Role{RoleSystem, RoleReconciler, RoleController, RoleOperator, RoleOperatorRead}

// AddUser issues the user of role r, one of the roles with a single user
// (reconciler, controller, operator, operator-read), writes its creds file
// and returns it: for a directory made before the role existed, or to
// issue again a user that was revoked (with a new key).
//
// Errors: [ErrUnknownRole] for a per-node role (use [Dir.AddNode]), the
// system role or an unknown one; [ErrUserExists] when the user exists and
// is not revoked; I/O errors.
func (d *Dir) AddUser(r Role) (User, error) {
	if r.perNode() || r == RoleSystem || !slices.Contains(initRoles, r) {
		return User{}, fmt.Errorf("role %q: %w (add-user issues reconciler, controller, operator or operator-read; add-node the node roles)", r, ErrUnknownRole)
	}
	name := UserName(r, "")
	if u, ok := d.m.Users[name]; ok && u.Revoked == nil {
		return User{}, fmt.Errorf("user %s: %w (revoke it to issue it again: meshfold auth revoke %s)", name, ErrUserExists, name)
	}
	u, err := d.issue(r, "")
	if err != nil {
		return User{}, err
	}
	return *u, d.save()
}

// AddOperator issues the named operator name: the user operator-<name>,
// with the operator's permissions except that it publishes approvals,
// operator events and acks only on the named subjects that end in its
// own name (events.Subjects.Named), so the server checks the `by` the
// stream records for it; writes its creds file and returns it. One per
// person: revoking one (meshfold auth revoke operator-<name>) leaves the
// others' working. A revoked one is issued again with a new key.
//
// Errors: an invalid name (matching events.ErrInvalid);
// [ErrReservedName] for "read"; [ErrUserExists] when the user exists and
// is not revoked; I/O errors.
func (d *Dir) AddOperator(name string) (User, error) {
	if err := checkOperatorName(name); err != nil {
		return User{}, err
	}
	user := UserName(RoleOperator, name)
	if u, ok := d.m.Users[user]; ok && u.Revoked == nil {
		return User{}, fmt.Errorf("user %s: %w (revoke it to issue it again: meshfold auth revoke %s)", user, ErrUserExists, user)
	}
	u, err := d.issue(RoleOperator, name)
	if err != nil {
		return User{}, err
	}
	return *u, d.save()
}

// prepare makes path an empty directory with mode 0700, or refuses.
// Missing parents are made with mode 0755, as mkdir -p would: only the
// auth directory itself is private, so a node's root or a state
// directory placed beside it later stays reachable.
func prepare(path string, force bool) error {
	entries, err := os.ReadDir(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.Mkdir(path, 0o700); err != nil {
			return err
		}
		return os.Chmod(path, 0o700)
	case err != nil:
		return err
	case len(entries) == 0:
		return os.Chmod(path, 0o700)
	case !force:
		return fmt.Errorf("%s: %w (pass --force to replace an auth directory)", path, ErrExists)
	}
	if _, err := os.Stat(filepath.Join(path, metaFile)); err != nil {
		return fmt.Errorf("%s: %w, and it is not an auth directory: refusing to touch it even with --force", path, ErrExists)
	}
	// Only what Init writes is removed.
	for _, name := range []string{metaFile, operatorJWT, operatorSeed, accountsDir, credsDir, resolverFile, SigningKeyFile, RetiredKeysFile, TrustFile} {
		if err := os.RemoveAll(filepath.Join(path, name)); err != nil {
			return err
		}
	}
	return os.Chmod(path, 0o700)
}

// Open opens the auth directory at path.
//
// Errors: [ErrNotAuthDir]; a malformed auth.json.
func Open(path string) (*Dir, error) {
	data, err := os.ReadFile(filepath.Join(path, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", path, ErrNotAuthDir)
	}
	if err != nil {
		return nil, err
	}
	d := &Dir{path: path}
	if err := json.Unmarshal(data, &d.m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(path, metaFile), err)
	}
	if d.m.V != metaVersion || d.m.Users == nil {
		return nil, fmt.Errorf("%s: version %d, want %d", filepath.Join(path, metaFile), d.m.V, metaVersion)
	}
	return d, nil
}

// AddNode issues the users node-<name> and provisioner-<name>, with the
// permissions of [Permissions], writes their creds files and returns them.
// A user that exists and is valid is left as it is; one that was revoked
// is issued again with a new key (so revoking a compromised node-<name>
// and adding the node again replaces that user only). It is
// [Dir.AddNodes] of one name.
//
// Errors: an invalid name (matching events.ErrInvalid); [ErrUserExists]
// when both users exist and are valid (nothing is written then); I/O
// errors.
func (d *Dir) AddNode(name string) ([]User, error) { return d.AddNodes(name) }

// errGivenTwice is the error of a node named twice in one [Dir.AddNodes].
var errGivenTwice = errors.New("given twice")

// AddNodes is [Dir.AddNode] of each of names, in order, with
// resolver.conf and auth.json written once at the end: adding a few
// hundred nodes one call each rewrote (and synced) both files every
// time, 31.5 s for 300 (a fresh user's finding M1). Every name is checked
// before any user is issued: an invalid name, a name given twice, or a
// node whose two users both exist and are valid refuses the whole call
// and writes nothing.
//
// Errors: an invalid or repeated name (matching events.ErrInvalid);
// [ErrUserExists] naming every such node; I/O errors (the creds files
// written before one are kept, and auth.json is not written: a rerun
// issues them again).
func (d *Dir) AddNodes(names ...string) ([]User, error) {
	type todo struct {
		node  string
		roles []Role
	}
	var (
		plan   []todo
		exists []string
		seen   = map[string]bool{}
	)
	for _, name := range names {
		if !events.ValidName(name) {
			return nil, &events.FieldError{Field: "node", Value: name, Err: events.ErrBadName}
		}
		if seen[name] {
			return nil, &events.FieldError{Field: "node", Value: name, Err: errGivenTwice}
		}
		seen[name] = true
		var roles []Role
		for _, r := range []Role{RoleNode, RoleProvisioner} {
			if u, ok := d.m.Users[UserName(r, name)]; !ok || u.Revoked != nil {
				roles = append(roles, r)
			}
		}
		if len(roles) == 0 {
			exists = append(exists, name)
			continue
		}
		plan = append(plan, todo{name, roles})
	}
	switch {
	case len(exists) == 1:
		name := exists[0]
		return nil, fmt.Errorf("node %s: users %s and %s: %w (revoke one to issue it again: meshfold auth revoke USER)",
			name, UserName(RoleNode, name), UserName(RoleProvisioner, name), ErrUserExists)
	case len(exists) > 1:
		return nil, fmt.Errorf("nodes %s: their node and provisioner users: %w (leave them out, or revoke a user to issue it again: meshfold auth revoke USER)",
			strings.Join(exists, ", "), ErrUserExists)
	}
	var out []User
	for _, p := range plan {
		for _, r := range p.roles {
			u, err := d.issue(r, p.node)
			if err != nil {
				return nil, err
			}
			out = append(out, *u)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	// The node's agent and provisioner trust the reconciler's key
	// through the trust file (written once, kept by rotations).
	if _, err := d.ensureSigningKey(); err != nil {
		return nil, err
	}
	return out, d.save()
}

// issue creates the user of role r (and node), writes its creds file and
// records it (auth.json is written by the caller).
func (d *Dir) issue(r Role, node string) (*User, error) {
	perms, err := Permissions(r, node, d.m.Names)
	if err != nil {
		return nil, err
	}
	accName, accPub := MeshAccountName, d.m.Account
	if r == RoleSystem {
		accName, accPub = SystemAccountName, d.m.System
	}
	akp, err := readSeed(filepath.Join(d.path, accountsDir, accName+".nk"))
	if err != nil {
		return nil, err
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	name := UserName(r, node)
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Permissions = perms
	if r == RoleNode {
		uc.Limits.Payload = NodeMaxPayload
	}
	now := time.Now().UTC().Truncate(time.Second)
	ujwt, err := uc.Encode(akp)
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	if err := writeFile(d.CredsPath(name), creds, 0o600); err != nil {
		return nil, err
	}
	u := &User{Name: name, Role: r, Node: node, PublicKey: upub, Account: accPub, Issued: now}
	if !r.perNode() {
		u.Node, u.Operator = "", node
	}
	d.m.Users[name] = u
	return u, nil
}

// Revoke revokes user in the mesh account's JWT (every JWT of the user's
// key issued until now) and rewrites the account JWT and resolver.conf. A
// running server learns of it only once the account JWT is pushed
// ([Dir.Push]) or the server restarts with the new JWT. Revoking a user
// twice is not an error (the revocation time moves forward).
//
// Errors: [ErrUnknownUser]; [ErrSystemUser]; I/O errors.
func (d *Dir) Revoke(user string) error {
	u, ok := d.m.Users[user]
	if !ok {
		return fmt.Errorf("user %q: %w", user, ErrUnknownUser)
	}
	if u.Account != d.m.Account {
		return fmt.Errorf("user %q: %w", user, ErrSystemUser)
	}
	ac, err := d.accountClaims(MeshAccountName)
	if err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Second)
	ac.RevokeAt(u.PublicKey, now)
	op, err := readSeed(filepath.Join(d.path, operatorSeed))
	if err != nil {
		return err
	}
	if err := d.signAccount(op, ac); err != nil {
		return err
	}
	u.Revoked = &now
	return d.save()
}

// accountClaims reads and decodes the JWT of the account named name.
func (d *Dir) accountClaims(name string) (*jwt.AccountClaims, error) {
	s, err := d.AccountJWT(name)
	if err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAccountClaims(s)
	if err != nil {
		return nil, fmt.Errorf("account %s: %w", name, err)
	}
	return ac, nil
}

// AccountJWT returns the JWT of the account named name (SYS or MESH).
func (d *Dir) AccountJWT(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(d.path, accountsDir, name+".jwt"))
	if err != nil {
		return "", fmt.Errorf("account %s: %w", name, err)
	}
	return string(b), nil
}

// signAccount signs ac with the operator's key and writes its JWT.
func (d *Dir) signAccount(op nkeys.KeyPair, ac *jwt.AccountClaims) error {
	s, err := ac.Encode(op)
	if err != nil {
		return fmt.Errorf("account %s: %w", ac.Name, err)
	}
	return writeFile(filepath.Join(d.path, accountsDir, ac.Name+".jwt"), []byte(s), 0o644)
}

// ServerAuth returns what an embedded server needs to trust this
// directory's operator and accounts.
//
// Errors: unreadable JWT files.
func (d *Dir) ServerAuth() (*store.ServerAuth, error) {
	op, err := os.ReadFile(filepath.Join(d.path, operatorJWT))
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	a := &store.ServerAuth{OperatorJWT: string(op), SystemAccount: d.m.System}
	for _, name := range []string{SystemAccountName, MeshAccountName} {
		s, err := d.AccountJWT(name)
		if err != nil {
			return nil, err
		}
		a.AccountJWTs = append(a.AccountJWTs, s)
	}
	return a, nil
}

// resolverPath is the path of the directory's resolver.conf.
func (d *Dir) resolverPath() string { return filepath.Join(d.path, resolverFile) }

// save writes resolver.conf, keeping the JWT directory it names (an
// operator's absolute path), then auth.json.
func (d *Dir) save() error {
	dir, err := d.resolverDir()
	if err != nil {
		return err
	}
	conf, err := d.ResolverConfigFor(dir)
	if err != nil {
		return err
	}
	if err := writeFile(d.resolverPath(), []byte(conf), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(d.m, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(d.path, metaFile), append(data, '\n'), 0o600)
}

func writeSeed(path string, kp nkeys.KeyPair) error {
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	return writeFile(path, seed, 0o600)
}

func readSeed(path string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("seed %s: %w", path, err)
	}
	return kp, nil
}

// writeFile writes data to path atomically and durably (atomicfile.Write:
// a temporary file in the same directory, synced, renamed, the directory
// synced), with mode perm; the parent directory is created with mode 0700
// when missing.
func writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, perm)
}
