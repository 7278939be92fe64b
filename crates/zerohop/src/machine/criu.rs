//! Whether a CRIU that checkpoints whole processes is here: found through
//! `ZEROHOP_CRIU` or on `PATH`, version 4.0 or later, and passing
//! `criu check`. Debian 12's CRIU 3.17 fails on recent kernels ("vdso:
//! Unexpected rt vDSO area bounds"); `scripts/build-criu.sh` builds CRIU 4
//! into `.tools/criu/`, which is only used once it is on `PATH` or named by
//! `ZEROHOP_CRIU`.

use super::availability::Availability;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming the CRIU binary to use.
pub const CRIU_ENV: &str = "ZEROHOP_CRIU";

/// The oldest CRIU accepted.
pub const CRIU_MIN_VERSION: CriuVersion = CriuVersion {
    major: 4,
    minor: 0,
    patch: 0,
};

/// What to do where no usable CRIU is found.
pub const CRIU_HINT: &str =
    "build CRIU 4 with scripts/build-criu.sh SRC, then put .tools/criu on PATH or set ZEROHOP_CRIU";

/// How long `criu --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(3);
/// How long `criu check` may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The most output read back from a CRIU command.
const OUTPUT_LIMIT: u64 = 64 * 1024;
/// The most of `criu check`'s output quoted in a reason.
const REASON_LIMIT: usize = 400;

/// A CRIU version, ordered by major, minor, then patch level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl CriuVersion {
    /// Whether this version can checkpoint the processes zerohop needs.
    pub fn is_supported(self) -> bool {
        self >= CRIU_MIN_VERSION
    }
}

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if self.patch != 0 {
            write!(f, ".{}", self.patch)?;
        }
        Ok(())
    }
}

/// The version in `criu --version`'s output (a line `Version: 4.2`, or
/// `Version: 3.17.1`); `None` where there is no such line or its number
/// does not parse.
pub fn parse_criu_version(output: &str) -> Option<CriuVersion> {
    let text = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?
        .trim();
    // The leading number, up to anything but digits and dots ("4.2-rc1").
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let mut parts = text[..end].split('.');
    let mut next = |required: bool| -> Option<u32> {
        match parts.next() {
            Some(p) => p.parse().ok(),
            None if required => None,
            None => Some(0),
        }
    };
    let version = CriuVersion {
        major: next(true)?,
        minor: next(false)?,
        patch: next(false)?,
    };
    Some(version)
}

/// CRIU as `zerohop info` reports it, from `ZEROHOP_CRIU` or `PATH`.
/// Available only where CRIU 4.0 or later passes `criu check`; the version
/// is reported wherever `criu --version` gives one, also when CRIU is too
/// old or its check fails.
pub fn criu_availability() -> Availability {
    criu_availability_from(std::env::var_os(CRIU_ENV), std::env::var_os("PATH"))
}

/// As [`criu_availability`], with the values of `ZEROHOP_CRIU` and `PATH`
/// given.
pub fn criu_availability_from(
    criu_env: Option<OsString>,
    path_env: Option<OsString>,
) -> Availability {
    let (criu, version) = match versioned_criu(criu_env.as_deref(), path_env.as_deref()) {
        Ok(found) => found,
        Err((why, None)) => {
            return Availability::unavailable(format!("not available: {why}; {CRIU_HINT}"))
        }
        Err((why, Some(version))) => {
            return Availability {
                available: false,
                version: Some(version.to_string()),
                why_not: Some(format!("{why}; {CRIU_HINT}")),
            }
        }
    };
    let shown = criu.display();
    let unavailable_at = |why: String| Availability {
        available: false,
        version: Some(version.to_string()),
        why_not: Some(why),
    };
    match run_with_timeout(&criu, "check", CHECK_TIMEOUT) {
        Ok((status, _)) if status.success() => Availability::available(Some(version.to_string())),
        Ok((status, output)) => unavailable_at(format!(
            "`{shown} check` fails ({status}): {}",
            criu_output_gist(&output)
        )),
        Err(why) => unavailable_at(format!("`{shown} check` {why}")),
    }
}

/// The CRIU to run, from `ZEROHOP_CRIU` or `PATH`, with its version: 4.0
/// or later. Unlike [`criu_availability`] it does not run `criu check`
/// (seconds), so a freeze does not wait for it; a CRIU that cannot
/// checkpoint here says so when it runs.
pub fn usable_criu() -> Result<(PathBuf, CriuVersion), String> {
    versioned_criu(
        std::env::var_os(CRIU_ENV).as_deref(),
        std::env::var_os("PATH").as_deref(),
    )
    .map_err(|(why, _)| format!("no usable CRIU: {why}; {CRIU_HINT}"))
}

/// The CRIU of `criu_env` or `path_env` and its version, 4.0 or later;
/// else why not, with the version where `--version` gave one.
fn versioned_criu(
    criu_env: Option<&OsStr>,
    path_env: Option<&OsStr>,
) -> Result<(PathBuf, CriuVersion), (String, Option<CriuVersion>)> {
    let criu = locate_criu(criu_env, path_env).map_err(|why| (why, None))?;
    let shown = criu.display();
    let (_, output) = run_with_timeout(&criu, "--version", VERSION_TIMEOUT)
        .map_err(|why| (format!("`{shown} --version` {why}"), None))?;
    let version = parse_criu_version(&output).ok_or_else(|| {
        let gist = criu_output_gist(&output);
        (
            format!("`{shown} --version` gives no version ({gist})"),
            None,
        )
    })?;
    if !version.is_supported() {
        let why = format!("{shown} is CRIU {version}, older than {CRIU_MIN_VERSION}");
        return Err((why, Some(version)));
    }
    Ok((criu, version))
}

/// The CRIU binary: `criu_env` (the value of `ZEROHOP_CRIU`) where set and
/// not empty, else `criu` in a directory of `path_env`.
fn locate_criu(criu_env: Option<&OsStr>, path_env: Option<&OsStr>) -> Result<PathBuf, String> {
    if let Some(named) = criu_env.filter(|v| !v.is_empty()) {
        let p = Path::new(named);
        // A bare name is a file in the current directory, not a PATH lookup.
        let p = if p.components().count() == 1 && p.is_relative() {
            Path::new(".").join(p)
        } else {
            p.to_path_buf()
        };
        return executable(&p)
            .map(|()| p)
            .map_err(|why| format!("{CRIU_ENV}={why}"));
    }
    let path_env = path_env.ok_or("PATH is not set, and neither is ZEROHOP_CRIU")?;
    std::env::split_paths(path_env)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join("criu"))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| format!("no criu on PATH, and {CRIU_ENV} is not set"))
}

/// Whether `p` is an executable file, with the reason (naming `p`) where
/// it is not.
fn executable(p: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a file", p.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{}: not executable", p.display()));
    }
    Ok(())
}

/// Runs `program arg`, its input empty, and returns its exit status and
/// output (stdout and stderr together, the first [`OUTPUT_LIMIT`] bytes);
/// kills it once `timeout` has passed. The output goes to an anonymous
/// in-memory file rather than a pipe, so that nothing waits on a reader.
fn run_with_timeout(
    program: &Path,
    arg: &str,
    timeout: Duration,
) -> Result<(ExitStatus, String), String> {
    let capture: File =
        rustix::fs::memfd_create("zerohop-criu-output", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| format!("cannot be run: no output file ({e})"))?
            .into();
    let stdout = capture
        .try_clone()
        .map_err(|e| format!("cannot be run: {e}"))?;
    let stderr = capture
        .try_clone()
        .map_err(|e| format!("cannot be run: {e}"))?;
    let mut child = Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot be run: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish in {timeout:?}"));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("could not be waited for: {e}"));
            }
        }
    };
    let mut capture = capture;
    let mut bytes = Vec::new();
    capture
        .seek(SeekFrom::Start(0))
        .and_then(|_| capture.take(OUTPUT_LIMIT).read_to_end(&mut bytes))
        .map_err(|e| format!("finished, but its output cannot be read: {e}"))?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The gist of a CRIU command's output, on one line: its `Error` lines
/// where it has some, else every line but warnings; at most
/// [`REASON_LIMIT`] bytes.
pub fn criu_output_gist(output: &str) -> String {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("Error"))
        .collect();
    let chosen = if errors.is_empty() {
        lines
            .into_iter()
            .filter(|l| !l.starts_with("Warn"))
            .collect()
    } else {
        errors
    };
    let mut text = chosen.join(" / ");
    if text.is_empty() {
        return "no output".into();
    }
    if text.len() > REASON_LIMIT {
        let mut cut = REASON_LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn v(major: u32, minor: u32, patch: u32) -> CriuVersion {
        CriuVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn versions_parse_from_criu_output() {
        assert_eq!(parse_criu_version("Version: 4.2\n"), Some(v(4, 2, 0)));
        assert_eq!(parse_criu_version("Version: 3.17.1\n"), Some(v(3, 17, 1)));
        assert_eq!(
            parse_criu_version("Version: 4.1.1\nGitID: v4.1.1-12-gabcdef\n"),
            Some(v(4, 1, 1))
        );
        assert_eq!(parse_criu_version("  Version:   4  \n"), Some(v(4, 0, 0)));
        assert_eq!(parse_criu_version("Version: 4.2-rc1"), Some(v(4, 2, 0)));
        for garbage in [
            "",
            "garbage",
            "criu 4.2",
            "Version:",
            "Version: x.y",
            "Version: .2",
            "Version: 4..2",
            "Version: 99999999999.1",
            "\u{fffd}\u{0}Version\u{fffd}",
        ] {
            assert_eq!(parse_criu_version(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn versions_compare_by_number() {
        assert!(v(4, 0, 0).is_supported());
        assert!(v(4, 2, 0).is_supported());
        assert!(v(10, 0, 0).is_supported());
        assert!(!v(3, 17, 1).is_supported());
        assert!(!v(3, 99, 99).is_supported());
        assert!(v(3, 17, 1) < v(3, 18, 0));
        assert!(v(4, 1, 1) > v(4, 1, 0));
        assert!(v(4, 10, 0) > v(4, 9, 0));
        assert_eq!(v(4, 2, 0).to_string(), "4.2");
        assert_eq!(v(3, 17, 1).to_string(), "3.17.1");
    }

    #[test]
    fn a_missing_criu_is_not_available_with_the_hint() {
        let gone = "/nonexistent/zerohop-test/criu";
        let a = criu_availability_from(Some(gone.into()), Some("/usr/bin:/bin".into()));
        assert!(!a.available);
        assert_eq!(a.version, None);
        let why = a.why_not.unwrap();
        assert!(why.starts_with("not available: ZEROHOP_CRIU="), "{why}");
        assert!(why.contains(gone), "{why}");
        assert!(why.contains(CRIU_HINT), "{why}");

        let empty = tempdir();
        let a = criu_availability_from(None, Some(empty.0.as_os_str().into()));
        let why = a.why_not.unwrap();
        assert!(!a.available);
        assert!(why.contains("no criu on PATH"), "{why}");
        assert!(why.contains(CRIU_HINT), "{why}");

        let a = criu_availability_from(None, None);
        assert!(!a.available && a.why_not.unwrap().contains(CRIU_HINT));
    }

    #[test]
    fn a_directory_or_a_plain_file_is_not_a_criu() {
        let dir = tempdir();
        let a = criu_availability_from(Some(dir.0.as_os_str().into()), None);
        assert!(a.why_not.unwrap().contains("not a file"));
        let plain = dir.0.join("criu");
        std::fs::write(&plain, "").unwrap();
        let a = criu_availability_from(Some(plain.as_os_str().into()), None);
        assert!(a.why_not.unwrap().contains("not executable"));
        // Nor is it found on PATH.
        let a = criu_availability_from(None, Some(dir.0.as_os_str().into()));
        assert!(a.why_not.unwrap().contains("no criu on PATH"));
    }

    #[test]
    fn stand_in_criu_scripts_are_judged_by_version_and_check() {
        let dir = tempdir();
        let fake = |name: &str, body: &str| {
            let p = dir.0.join(name);
            let mut f = File::create(&p).unwrap();
            writeln!(f, "#!/bin/sh\n{body}").unwrap();
            drop(f);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            Some(p.into_os_string())
        };
        let good = fake(
            "good",
            r#"case "$1" in --version) echo "Version: 4.2";; check) echo "Looks good.";; esac"#,
        );
        assert_eq!(
            criu_availability_from(good, None),
            Availability::available(Some("4.2".into()))
        );

        let old = fake("old", r#"echo "Version: 3.17.1"; exit 1"#);
        let a = criu_availability_from(old, None);
        assert!(!a.available);
        assert_eq!(a.version.as_deref(), Some("3.17.1"));
        let why = a.why_not.unwrap();
        assert!(
            why.contains("older than 4.0") && why.contains(CRIU_HINT),
            "{why}"
        );

        let failing = fake(
            "failing",
            r#"case "$1" in --version) echo "Version: 4.2";; check)
               echo "Warn  (criu/kerndat.c:1): a warning" >&2
               echo "Error (criu/vdso.c:1): vdso: Unexpected rt vDSO area bounds" >&2
               exit 1;; esac"#,
        );
        let a = criu_availability_from(failing, None);
        assert!(!a.available);
        assert_eq!(a.version.as_deref(), Some("4.2"));
        let why = a.why_not.unwrap();
        assert!(why.contains("Unexpected rt vDSO area bounds"), "{why}");
        assert!(!why.contains("a warning"), "{why}");

        let garbage = fake("garbage", "echo 'no such thing'");
        let why = criu_availability_from(garbage, None).why_not.unwrap();
        assert!(
            why.contains("gives no version") && why.contains(CRIU_HINT),
            "{why}"
        );

        let hangs = fake("hangs", "exec sleep 60").unwrap();
        let started = Instant::now();
        let e =
            run_with_timeout(Path::new(&hangs), "check", Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "{e}");
        assert_eq!(e, "did not finish in 200ms");
    }

    #[test]
    fn summaries_are_one_bounded_line() {
        assert_eq!(criu_output_gist(""), "no output");
        assert_eq!(criu_output_gist("Warn (x): only a warning\n"), "no output");
        assert_eq!(
            criu_output_gist("CRIU needs CAP_SYS_ADMIN: \nsetcap cap_checkpoint_restore+eip /x\n"),
            "CRIU needs CAP_SYS_ADMIN: / setcap cap_checkpoint_restore+eip /x"
        );
        let long = "é".repeat(REASON_LIMIT);
        let s = criu_output_gist(&long);
        assert!(s.len() <= REASON_LIMIT + 3 && s.ends_with("..."));
    }

    /// A fresh directory, removed on drop.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir() -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "zerohop-criu-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
