//! What `/proc` says of another process.

use std::path::PathBuf;
use zerohop::{Error, ErrorKind, Result};

/// Whether `/proc` lists process `pid` (a zombie too).
pub fn exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// `Err` naming `pid` where no such process exists.
pub fn expect_exists(pid: u32) -> Result<()> {
    match exists(pid) {
        true => Ok(()),
        false => Err(Error::new(ErrorKind::NotFound, format!("no process {pid}"))),
    }
}

/// The process's state letter (`R`, `S`, `Z`, ...), from `/proc/PID/stat`.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may itself hold spaces and ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The process's resident host memory (`VmRSS`).
pub fn resident_bytes(pid: u32) -> Result<u64> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "cannot read", e))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| Error::new(ErrorKind::Format, format!("no VmRSS in {}", path.display())))
}

/// Whether the process has an NVIDIA device open or mapped: then it holds
/// GPU state that CRIU cannot dump, and the driver must checkpoint it
/// first. Where `/proc` cannot be read (another user's process), `Err`.
pub fn holds_gpu_state(pid: u32) -> Result<bool> {
    let is_nvidia = |s: &str| s.starts_with("/dev/nvidia");
    let fds = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = std::fs::read_dir(&fds).map_err(|e| Error::io(&fds, "cannot list", e))?;
    for entry in entries.flatten() {
        if let Ok(target) = std::fs::read_link(entry.path()) {
            if target.to_str().is_some_and(is_nvidia) {
                return Ok(true);
            }
        }
    }
    let maps = PathBuf::from(format!("/proc/{pid}/maps"));
    let maps = std::fs::read_to_string(&maps).map_err(|e| Error::io(&maps, "cannot read", e))?;
    // The path is the last field, after five others.
    Ok(maps
        .lines()
        .any(|l| l.split_whitespace().nth(5).is_some_and(is_nvidia)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_seen_and_holds_no_gpu_state() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(matches!(state(me), Some('R' | 'S')));
        assert!(resident_bytes(me).unwrap() > 0);
        assert!(!holds_gpu_state(me).unwrap());
        assert!(!exists(u32::MAX));
        assert_eq!(state(u32::MAX), None);
        assert!(resident_bytes(u32::MAX).is_err());
        assert!(holds_gpu_state(u32::MAX).is_err());
        assert_eq!(
            expect_exists(u32::MAX).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    #[test]
    fn a_zombie_is_seen_as_one() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for yet: once it has exited it stays a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while state(pid) != Some('Z') {
            assert!(
                std::time::Instant::now() < deadline,
                "{pid} never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(exists(pid));
        let mut child = child;
        child.wait().unwrap();
        assert!(!exists(pid));
    }
}
