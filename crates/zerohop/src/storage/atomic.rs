//! Atomic replacement of files and directories: write under a temporary
//! sibling name, make it durable, rename it into place, sync the parent.
//! Temporary names carry the writer's host name and pid, so leftovers of a
//! crashed writer on this host are recognised (their pid is gone) and
//! removed, while those of writers on other hosts sharing the directory
//! (a network file system) are left alone.

use super::sync_dir;
use crate::{Error, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MARK: &str = ".zerohop-tmp-";

/// A fresh temporary sibling of `target`: `.NAME.zerohop-tmp-HOST-PID-N`.
pub fn temp_sibling(target: &Path) -> Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{} has no file name", target.display())))?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!("{MARK}{}-{}-{n}", host_name(), std::process::id()));
    Ok(parent_of(target).join(tmp))
}

/// The directory holding `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any missing parents, syncing the directory that holds
/// each new one, so a later durable save inside cannot vanish with them.
pub fn create_dir_durable(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => break,
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create", e))?;
    missing.iter().try_for_each(|d| sync_dir(parent_of(d)))
}

/// Writes `bytes` to `target`, a new file, durably: under a temporary
/// sibling, synced, then renamed into place with [`commit_new`].
pub fn write_new(target: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = temp_sibling(target)?;
    let written = std::fs::File::create_new(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|e| Error::io(&tmp, "cannot write", e))
        .and_then(|()| commit_new(&tmp, target));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Renames the durable `tmp` over `target` and syncs their directory: after
/// this returns, `target` is the new content even across a crash.
pub fn commit(tmp: &Path, target: &Path) -> Result<()> {
    std::fs::rename(tmp, target).map_err(|e| rename_error(tmp, target, e))?;
    sync_dir(parent_of(target))
}

/// As [`commit`], but fails if `target` exists (even as an empty directory
/// made meanwhile) instead of replacing it.
pub fn commit_new(tmp: &Path, target: &Path) -> Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, tmp, CWD, target, RenameFlags::NOREPLACE) {
        Ok(()) => {}
        // The file system cannot refuse to replace: check, then rename
        // (a rename over a non-empty directory still fails).
        Err(rustix::io::Errno::INVAL) => {
            if target.exists() {
                return Err(Error::new(
                    crate::ErrorKind::AlreadyExists,
                    format!("{} already exists", target.display()),
                ));
            }
            std::fs::rename(tmp, target).map_err(|e| rename_error(tmp, target, e))?;
        }
        Err(e) => return Err(rename_error(tmp, target, e.into())),
    }
    sync_dir(parent_of(target))
}

fn rename_error(tmp: &Path, target: &Path, e: std::io::Error) -> Error {
    Error::io(
        target,
        &format!("cannot rename {} into place as", tmp.display()),
        e,
    )
}

/// Removes temporary siblings of `target` left by crashed writers on this
/// host. Best effort: what cannot be removed is left. Returns the count.
pub fn remove_stale_temps(target: &Path) -> usize {
    match target.file_name() {
        Some(name) => remove_stale_in(parent_of(target), Some(name)),
        None => 0,
    }
}

/// Removes leftover temporary entries in `dir` (of any target name) whose
/// writer on this host no longer runs. Best effort; returns the count.
pub fn remove_stale_temps_in(dir: &Path) -> usize {
    remove_stale_in(dir, None)
}

fn remove_stale_in(dir: &Path, name: Option<&OsStr>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let host = host_name();
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some((owner_host, pid)) = temp_owner(&entry.file_name(), name) else {
            continue;
        };
        if owner_host != host || process_alive(pid) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed += usize::from(gone.is_ok());
    }
    if removed > 0 {
        let _ = sync_dir(dir);
    }
    removed
}

/// The writer (host, pid) in `entry` if it is a temporary sibling of `name`
/// (of any name when `None`).
fn temp_owner(entry: &OsStr, name: Option<&OsStr>) -> Option<(String, u32)> {
    let entry = entry.to_str()?.strip_prefix('.')?;
    let tail = match name {
        Some(name) => entry.strip_prefix(name.to_str()?)?.strip_prefix(MARK)?,
        None => entry.rsplit_once(MARK)?.1,
    };
    let (rest, n) = tail.rsplit_once('-')?;
    n.parse::<u64>().ok()?;
    let (host, pid) = rest.rsplit_once('-')?;
    Some((host.to_string(), pid.parse().ok()?))
}

/// This machine's host name, made safe for a file name.
fn host_name() -> String {
    let uname = rustix::system::uname();
    let raw = uname.nodename().to_string_lossy();
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "localhost".into()
    } else {
        safe
    }
}

fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // Signal 0 only checks that the process exists; EPERM means it does.
    matches!(
        rustix::process::test_kill_process(pid),
        Ok(()) | Err(rustix::io::Errno::PERM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_round_trip_to_their_owner() {
        let t = temp_sibling(Path::new("/x/ckpt")).unwrap();
        let name = t.file_name().unwrap();
        let me = Some((host_name(), std::process::id()));
        assert_eq!(temp_owner(name, Some(OsStr::new("ckpt"))), me);
        assert_eq!(temp_owner(name, None), me);
        assert_eq!(temp_owner(name, Some(OsStr::new("ckp"))), None);
        assert_eq!(
            temp_owner(OsStr::new(".ckpt.zerohop-tmp-h-12-x"), None),
            None
        );
        assert_eq!(
            temp_owner(OsStr::new("ckpt.zerohop-tmp-h-12-0"), None),
            None
        );
        assert_eq!(
            temp_owner(OsStr::new(".a.zerohop-tmp-node-3.x-12-0"), None),
            Some(("node-3.x".to_string(), 12))
        );
        assert_eq!(parent_of(Path::new("a")), Path::new("."));
    }

    #[test]
    fn commit_new_never_replaces() {
        let dir = std::env::temp_dir().join(format!("zerohop-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tmp, target) = (dir.join("t"), dir.join("final"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::create_dir(&target).unwrap();
        assert!(commit_new(&tmp, &target).is_err());
        std::fs::remove_dir(&target).unwrap();
        commit_new(&tmp, &target).unwrap();
        assert!(target.is_dir() && !tmp.exists());
        create_dir_durable(&dir.join("a/b/c")).unwrap();
        assert!(dir.join("a/b/c").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
