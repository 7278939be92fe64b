//! Atomic replacement of files and directories: write under a temporary
//! sibling name, make it durable, rename it into place, sync the parent.
//! Temporary names carry the writer's pid, so leftovers of a crashed writer
//! are recognised (their pid is gone) and removed.

use super::sync_dir;
use crate::{Error, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MARK: &str = ".zerohop-tmp-";

/// A fresh temporary sibling of `target`: `.NAME.zerohop-tmp-PID-N`.
pub fn temp_sibling(target: &Path) -> Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{} has no file name", target.display())))?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!("{MARK}{}-{n}", std::process::id()));
    Ok(parent_of(target).join(tmp))
}

/// The directory holding `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Renames the durable `tmp` over `target` and syncs their directory: after
/// this returns, `target` is the new content even across a crash.
pub fn commit(tmp: &Path, target: &Path) -> Result<()> {
    std::fs::rename(tmp, target).map_err(|e| {
        Error::io(
            target,
            &format!("cannot rename {} into place as", tmp.display()),
            e,
        )
    })?;
    sync_dir(parent_of(target))
}

/// Removes temporary siblings of `target` left by writers that no longer
/// run (crashed saves). Returns how many were removed.
pub fn remove_stale_temps(target: &Path) -> Result<usize> {
    match target.file_name() {
        Some(name) => remove_stale_in(parent_of(target), Some(name)),
        None => Ok(0),
    }
}

/// Removes every leftover temporary entry in `dir` (of any target name)
/// whose writer no longer runs. Returns how many were removed.
pub fn remove_stale_temps_in(dir: &Path) -> Result<usize> {
    remove_stale_in(dir, None)
}

fn remove_stale_in(dir: &Path, name: Option<&OsStr>) -> Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(dir, "cannot list", e)),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some(pid) = temp_owner(&entry.file_name(), name) else {
            continue;
        };
        if process_alive(pid) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&path, "cannot remove leftover", e)),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// The pid in `entry` if it is a temporary sibling of `name` (of any name
/// when `None`).
fn temp_owner(entry: &OsStr, name: Option<&OsStr>) -> Option<u32> {
    let entry = entry.to_str()?.strip_prefix('.')?;
    let tail = match name {
        Some(name) => entry.strip_prefix(name.to_str()?)?.strip_prefix(MARK)?,
        None => entry.rsplit_once(MARK)?.1,
    };
    let (pid, n) = tail.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_round_trip_to_their_owner() {
        let t = temp_sibling(Path::new("/x/ckpt")).unwrap();
        let name = t.file_name().unwrap();
        assert_eq!(
            temp_owner(name, Some(OsStr::new("ckpt"))),
            Some(std::process::id())
        );
        assert_eq!(temp_owner(name, None), Some(std::process::id()));
        assert_eq!(temp_owner(name, Some(OsStr::new("ckp"))), None);
        assert_eq!(temp_owner(OsStr::new(".ckpt.zerohop-tmp-12-x"), None), None);
        assert_eq!(temp_owner(OsStr::new("ckpt.zerohop-tmp-12-0"), None), None);
        assert_eq!(parent_of(Path::new("a")), Path::new("."));
    }
}
