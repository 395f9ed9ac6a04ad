//! The snapshot file on disk: written whole to a temporary file, fsynced, renamed over the
//! snapshot, the directory fsynced — a crash or an error leaves the old snapshot or the new
//! one, never a mix, and no symbolic link beside the snapshot is ever followed.
//!
//! **The temporary file** is `.NAME.tmp-XXXXXXXXXXXXXXXX` (16 random hex digits) in the
//! snapshot's directory, created exclusively and without following a link (`O_CREAT|O_EXCL|
//! O_NOFOLLOW`): a file or link planted at any name, guessed or not, makes the creation fail
//! (and a new name is drawn); it is never opened, truncated or renamed. On an error the
//! temporary file is removed. Temporary files left by a crash are removed at start: regular
//! files with that pattern only, never links.
//!
//! **The snapshot's own path** may be a symbolic link: one the administrator made there on
//! purpose (to keep the snapshot on another disk, say), so it is followed, as most programs
//! follow a link at the file they are told to write: the new snapshot replaces the link's
//! target, in the target's directory, and the link stays. Only a link owned by this user or
//! by root is followed — the kernel's `fs.protected_symlinks` rule, applied whatever that
//! setting is: a link another user planted at the path (in a shared directory such as `/tmp`)
//! would otherwise let that user choose which file the server replaces. Such a link is an error.

use std::fs::{File, OpenOptions};
use std::io::{Error, ErrorKind};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Links followed at the snapshot's path, at most (the kernel's own limit, `ELOOP`).
const MAX_LINKS: usize = 40;

/// Names drawn for a temporary file before giving up: each collides only with a file planted
/// at a random 64-bit name.
const MAX_TRIES: usize = 16;

/// The file the snapshot at `path` is written to: `path`, or the target of the symbolic link
/// there (followed only if owned by this user or root; module docs). The target need not
/// exist yet.
pub fn target(path: &Path) -> std::io::Result<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        };
        if !meta.file_type().is_symlink() {
            return Ok(p);
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} is a symbolic link owned by user {}, neither this user nor root: not followed (give the file itself, or chown -h the link)",
                    p.display(),
                    meta.uid()
                ),
            ));
        }
        let to = std::fs::read_link(&p)?;
        p = directory(&p).join(to);
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!("{}: more than {MAX_LINKS} symbolic links", path.display()),
    ))
}

/// The directory a file is in (`.` for a bare name).
fn directory(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The prefix of the temporary files of the snapshot at `target`: `.NAME.tmp-`.
fn prefix(target: &Path) -> String {
    let name = target
        .file_name()
        .map_or("snapshot".into(), |n| n.to_string_lossy());
    format!(".{name}.tmp-")
}

/// Creates the file `path`, which must not exist: create_new is `O_CREAT|O_EXCL`, which fails
/// on anything at the name, a link (even a dangling one) too; `O_NOFOLLOW` says the same once
/// more.
fn open_new(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// A temporary file beside `target`, new (never a file or link that was there), with its
/// path: removed when dropped unless [`Temporary::keep`] was called.
struct Temporary {
    file: File,
    path: PathBuf,
    keep: bool,
}

impl Temporary {
    fn create(target: &Path) -> std::io::Result<Self> {
        let prefix = prefix(target);
        for _ in 0..MAX_TRIES {
            let mut r = [0u8; 8];
            getrandom::fill(&mut r).map_err(|e| Error::other(format!("getrandom: {e}")))?;
            let path = directory(target).join(format!("{prefix}{:016x}", u64::from_le_bytes(r)));
            match open_new(&path) {
                Ok(file) => {
                    return Ok(Self {
                        file,
                        path,
                        keep: false,
                    })
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{MAX_TRIES} random names for the temporary file were all taken in {}",
                directory(target).display()
            ),
        ))
    }

    /// Renames it over `target`: it is no longer removed.
    fn rename_over(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.keep = true;
        Ok(())
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether [`write_with`] can write the snapshot at `path`: its target is not a directory,
/// and a temporary file can be created beside it (then removed). Nothing at the path or
/// beside it is opened, truncated or followed (but a link at the path, as [`target`] does).
/// Called at start, so that a path in a missing or read-only directory is an error then, not
/// at the first snapshot.
pub fn writable(path: &Path) -> std::io::Result<()> {
    let target = target(path)?;
    if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
        return Err(Error::new(ErrorKind::IsADirectory, "it is a directory"));
    }
    Temporary::create(&target).map(drop)
}

/// Writes the snapshot at `path` with `fill`: into a new temporary file beside its target,
/// fsynced, renamed over the target, the directory fsynced. On an error (`fill`'s too) the
/// temporary file is removed and the old snapshot is as it was.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let target = target(path)?;
    let mut tmp = Temporary::create(&target)?;
    fill(&mut tmp.file)?;
    tmp.file.sync_all()?;
    tmp.rename_over(&target)?;
    sync_directory(directory(&target))
}

/// fsyncs a directory, so that a rename in it lasts. A file system that cannot (`EINVAL`) is
/// not an error: there is nothing more to do there.
fn sync_directory(dir: &Path) -> std::io::Result<()> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    match d.sync_all() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r,
    }
}

/// Removes the temporary files a crash left beside the snapshot at `path` (regular files
/// named `.NAME.tmp-` and 16 hex digits; links and anything else are left alone): the paths
/// removed. A file replaced by a link between the look and the removal loses only the link
/// (unlink never follows one).
pub fn remove_stale(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let target = target(path)?;
    let prefix = prefix(&target);
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(directory(&target))? {
        let entry = entry?;
        let name = entry.file_name();
        let stale = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()));
        // DirEntry::file_type does not follow a link.
        if stale && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path())?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The directory's entries, sorted.
    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_the_old_snapshot_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("state.snap");
        write_with(&snap, |f| f.write_all(b"old snapshot")).unwrap();
        let err = write_with(&snap, |f| {
            f.write_all(b"half of a new")?;
            Err(Error::other("the disk is full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "the disk is full");
        assert_eq!(std::fs::read(&snap).unwrap(), b"old snapshot");
        assert_eq!(entries(dir.path()), ["state.snap"]);
        // A writer that panics removes its temporary file too.
        let r = std::panic::catch_unwind(|| write_with(&snap, |_| panic!("a bug")));
        assert!(r.is_err());
        assert_eq!(std::fs::read(&snap).unwrap(), b"old snapshot");
        assert_eq!(entries(dir.path()), ["state.snap"]);
    }

    #[test]
    fn the_temporary_file_is_new_never_a_link_or_a_file_at_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let taken = dir.path().join(".state.snap.tmp-0000000000000000");
        std::os::unix::fs::symlink(&victim, &taken).unwrap();
        assert_eq!(
            open_new(&taken).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        std::fs::remove_file(&taken).unwrap();
        std::fs::write(&taken, "a file").unwrap();
        assert_eq!(
            open_new(&taken).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&taken).unwrap(), b"a file");
        // A dangling link: its target is not created.
        let dangling = dir.path().join(".state.snap.tmp-1111111111111111");
        let nowhere = dir.path().join("nowhere");
        std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
        assert_eq!(
            open_new(&dangling).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        assert!(!nowhere.exists());
    }

    #[test]
    fn stale_temporary_files_are_removed_links_and_other_names_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let at = |n: &str| dir.path().join(n);
        std::fs::write(at(".state.snap.tmp-0123456789abcdef"), "crash").unwrap();
        std::fs::write(at(".state.snap.tmp-0123"), "short").unwrap();
        std::fs::write(at(".other.snap.tmp-0123456789abcdef"), "another").unwrap();
        std::fs::create_dir(at(".state.snap.tmp-00000000000000dd")).unwrap();
        std::os::unix::fs::symlink(&victim, at(".state.snap.tmp-00000000000000aa")).unwrap();
        let removed = remove_stale(&at("state.snap")).unwrap();
        assert_eq!(removed, [at(".state.snap.tmp-0123456789abcdef")]);
        assert_eq!(
            entries(dir.path()),
            [
                ".other.snap.tmp-0123456789abcdef",
                ".state.snap.tmp-00000000000000aa",
                ".state.snap.tmp-00000000000000dd",
                ".state.snap.tmp-0123",
                "victim",
            ]
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn a_link_at_the_snapshot_path_is_followed_if_this_user_or_root_made_it() {
        let top = tempfile::tempdir().unwrap();
        let (dir, disk) = (top.path().join("etc"), top.path().join("disk"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&disk).unwrap();
        let real = disk.join("real.snap");
        let snap = dir.join("state.snap");
        // A link to a file not there yet, relative to the link's directory.
        std::os::unix::fs::symlink("../disk/real.snap", &snap).unwrap();
        writable(&snap).unwrap();
        write_with(&snap, |f| f.write_all(b"one")).unwrap();
        write_with(&snap, |f| f.write_all(b"two")).unwrap();
        assert_eq!(std::fs::read(&real).unwrap(), b"two");
        assert!(std::fs::symlink_metadata(&snap)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(entries(&disk), ["real.snap"]);
        assert_eq!(entries(&dir), ["state.snap"]);
        // Owned by another user: not followed, nothing written. Only root can make such a link.
        if std::os::unix::fs::lchown(&snap, Some(65534), Some(65534)).is_err() {
            eprintln!("not root: the link of another user is not tried");
            return;
        }
        let e = writable(&snap).unwrap_err();
        assert!(e.to_string().contains("owned by user 65534"), "{e}");
        assert!(write_with(&snap, |f| f.write_all(b"three")).is_err());
        assert_eq!(std::fs::read(&real).unwrap(), b"two");
        assert_eq!(entries(&disk), ["real.snap"]);
    }
}
