// Package atomicfile writes a file so that a crash, of the process or of
// the machine, leaves its old content or its new, never an empty or
// partial file: a temporary file in the same directory, the data, fsync,
// rename over the target (or a link, for a file created once), fsync of
// the directory. Every file of meshfold's meant to survive a crash is
// written through it (filled files, the process runtime's records, keys,
// credentials, trust lists); [PlaceTree] does the same for a directory
// tree written whole (an unpacked bundle).
//
// It imports nothing but the standard library, so every package can use
// it without linking anything more.
package atomicfile
