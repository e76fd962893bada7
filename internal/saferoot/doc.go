// Package saferoot resolves paths under a root directory for a writer
// that runs as root, so that nothing a less privileged account can write
// redirects it: the node agent's filled files (DESIGN.md §8), written
// under --root, which the packaged unit sets to /.
//
// [Root.Parent] walks a path's parent directory component by component,
// each one opened with openat(O_NOFOLLOW|O_DIRECTORY) from the directory
// held before it, and returns it held open as a [Dir]; nothing is looked
// up by path again after the check. A symlink met on the way is followed
// only when the directory holding it could not have been written by
// anyone but root (or the writer's own uid): owned by uid 0 (or that
// uid) and not writable by group or others. So the host's links under
// "--root /" (/var/run -> /run, in a root-owned 0755 /var) work, while a
// link in a directory a module account owns, or in a world-writable one
// such as /tmp (sticky or not), is refused ([ErrNotFollowed]): that
// account could have planted it to point anywhere. systemd calls such a
// step an unsafe transition (CHASE_SAFE); the rule here is stricter, as
// the writer need not trust the directory's owner at all. A directory
// owned by a module account is still entered (the account can only move
// there what it could write itself), and missing directories are made
// (0755, owned by the writer) through the held descriptors.
//
// ".." and absolute link targets resolve as the kernel resolves them and
// must stay inside the root ([ErrEscapes]); under a root of "/", ".."
// stops at it, as the kernel's does.
//
// Every method of [Dir] takes a single name in it and never follows a
// symlink at that name: openat(O_NOFOLLOW), fstatat(AT_SYMLINK_NOFOLLOW),
// renameat, unlinkat, linkat. Owner and mode changes are made through an
// open descriptor (fchown, fchmod), never by name.
package saferoot
