//! The `zerohop` binary end to end on host memory: happy paths, and bad
//! input that must give a clear error and a non-zero exit, never a panic;
//! and its checkpoints in an object store (`object_store`).

mod common;
#[path = "../../zerohop-s3/tests/common/mod.rs"]
mod s3;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn zerohop(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(args)
        .output()
        .expect("zerohop runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Fails with a message on stderr containing `needle`, without panicking.
fn fails_with(args: &[&str], needle: &str) {
    common::assert_clear_failure(&zerohop(args), args, needle);
}

#[test]
fn gen_then_load_with_verify_as_json() {
    let model = tmp("m.safetensors");
    let m = model.to_str().unwrap();
    assert!(zerohop(&["gen", "--size", "8MiB", m]).status.success());
    let out = zerohop(&["load", m, "--device", "host", "--verify", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true);
    assert!(v["tensors"].as_u64().unwrap() > 10);
    let tensor_bytes = v["bytes"].as_u64().unwrap();
    assert!(tensor_bytes > 7 << 20 && tensor_bytes < std::fs::metadata(&model).unwrap().len());
    assert!(v["gbps"].as_f64().unwrap() > 0.0);
    let path = v["path"].as_str().unwrap();
    assert!(
        path.starts_with("mapped") || path.starts_with("staged"),
        "{path}"
    );

    let out = zerohop(&[
        "load",
        m,
        "--raw",
        "--device",
        "host",
        "--per-tensor",
        "--verify",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("device contents match"));
}

#[test]
fn info_and_bench_run_without_a_gpu() {
    let out = zerohop(&["info", "--json", env!("CARGO_TARGET_TMPDIR")]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["staging"]["total_bytes"].as_u64().unwrap() > 0);
    assert!(v.get("gds").is_some() && v.get("io_uring").is_some());

    let model = tmp("b.safetensors");
    let m = model.to_str().unwrap();
    assert!(zerohop(&["gen", "--size", "4MiB", m]).status.success());
    let out = zerohop(&[
        "bench",
        "load",
        m,
        "--device",
        "host",
        "--repeat",
        "1",
        "--compare-routes",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // One run per route: auto, mapped, staged, page-cache DMA.
    assert_eq!(v["runs"].as_array().unwrap().len(), 4);
    assert!(v["ratio_to_h2d"].as_f64().unwrap() > 0.0);
    assert!(v["staging_bytes"].as_u64().unwrap() <= 256 << 20);
}

#[test]
fn bad_input_is_a_clear_error() {
    let missing = tmp("missing.safetensors");
    fails_with(
        &["load", missing.to_str().unwrap(), "--device", "host"],
        "No such file",
    );
    fails_with(
        &["load", env!("CARGO_TARGET_TMPDIR"), "--device", "host"],
        "directory",
    );
    let garbage = tmp("garbage.safetensors");
    std::fs::write(
        &garbage,
        b"\x1e\0\0\0\0\0\0\0{not json at all, no no no no}",
    )
    .unwrap();
    fails_with(
        &["load", garbage.to_str().unwrap(), "--device", "host"],
        "JSON",
    );
    let model = tmp("t.safetensors");
    assert!(zerohop(&["gen", "--size", "1MiB", model.to_str().unwrap()])
        .status
        .success());
    let bytes = std::fs::read(&model).unwrap();
    let truncated = tmp("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &["load", truncated.to_str().unwrap(), "--device", "host"],
        "past the end",
    );
    fails_with(
        &["load", model.to_str().unwrap(), "--device", "tpu:0"],
        "unknown device",
    );
    // No GPU here (no driver) or no 100th GPU there: an error either way.
    fails_with(
        &["load", model.to_str().unwrap(), "--device", "cuda:99"],
        "CUDA",
    );
    fails_with(
        &[
            "load",
            model.to_str().unwrap(),
            "--device",
            "host",
            "--staging",
            "1KiB",
        ],
        "staging",
    );
    let out = zerohop(&["gen", "--size", "lots", "x"]);
    assert!(!out.status.success());
}

/// Root reads any file, so drop to `nobody` (with util-linux's setpriv) to
/// see a real permission error. The binary and the file go to a directory
/// anyone may enter (the checkout's own may not be); in CI a test that
/// cannot run fails instead of passing unseen.
#[test]
fn unreadable_file_is_a_permission_error() {
    use std::os::unix::fs::PermissionsExt;
    let skip = |why: String| {
        assert!(std::env::var_os("CI").is_none(), "cannot run in CI: {why}");
        eprintln!("skipped: {why}");
    };
    let dir = std::env::temp_dir().join(format!("zerohop-permission-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.join("secret.safetensors");
    std::fs::write(&secret, b"x").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let args = ["load", secret.to_str().unwrap(), "--device", "host"];
    let out = if rustix::process::geteuid().is_root() {
        let bin = dir.join("zerohop");
        std::fs::copy(env!("CARGO_BIN_EXE_zerohop"), &bin).unwrap();
        let privs = ["--reuid=65534", "--regid=65534", "--clear-groups"];
        let run = Command::new("setpriv")
            .args(privs)
            .arg(&bin)
            .args(args)
            .output();
        match run {
            Ok(out) => out,
            Err(e) => {
                std::fs::remove_dir_all(&dir).unwrap();
                return skip(format!("running as root without setpriv ({e})"));
            }
        }
    } else {
        zerohop(&args)
    };
    std::fs::remove_dir_all(&dir).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("setpriv:") {
        return skip(format!("setpriv cannot run zerohop as nobody here: {err}"));
    }
    assert!(!out.status.success());
    assert!(
        err.contains("Permission denied") && !err.contains("panicked"),
        "{err}"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The demo works in a directory of its own and removes it at the end,
/// having printed the no-GPU note (where there is no GPU) once.
#[test]
fn demo_leaves_nothing_behind() {
    let dir = tmp("demo");
    std::fs::create_dir_all(&dir).unwrap();
    let out = zerohop(&["demo", "--size", "4MiB", "--dir", dir.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("contents match the files"), "{stdout}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{stdout}");
    assert!(stdout.contains("== removed"), "{stdout}");
    let notes = stderr.lines().filter(|l| l.starts_with("note:")).count();
    assert!(notes <= 1, "{stderr}");
    if stdout.contains("into host memory") {
        // On host memory nothing is pinned and the CPU computes checksums.
        assert!(!stdout.contains("pinned slots"), "{stdout}");
        assert!(!stdout.contains("on the device"), "{stdout}");
        assert!(stdout.contains("checksum on the host"), "{stdout}");
    }

    // On an error too.
    let out = zerohop(&[
        "demo",
        "--size",
        "1MiB",
        "--device",
        "tpu:0",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown device"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Ctrl-C during the demo removes its directory too, and the exit status
/// says the demo was interrupted.
#[test]
fn an_interrupted_demo_leaves_nothing_behind() {
    let dir = tmp("demo-interrupted");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(["demo", "--size", "1GiB", "--device", "host", "--dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_dir(&dir).unwrap().next().is_none() {
        assert!(
            started.elapsed().as_secs() < 30,
            "the demo made no directory"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Past the point where the signal thread is set up.
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: signals our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGINT),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("interrupted: removed"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "left behind");
}

#[test]
fn demo_keeps_its_files_when_asked_and_says_where() {
    let dir = tmp("demo-keep");
    std::fs::create_dir_all(&dir).unwrap();
    let out = zerohop(&[
        "demo",
        "--size",
        "2MiB",
        "--device",
        "host",
        "--keep",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let kept: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].join("demo.safetensors").is_file());
    assert!(kept[0].join("demo-checkpoint").is_dir());
    assert!(
        stdout.contains(&format!(
            "kept the demo model and its checkpoint in {}",
            kept[0].display()
        )),
        "{stdout}"
    );
    std::fs::remove_dir_all(&kept[0]).unwrap();
}

#[test]
fn info_on_a_missing_path_fails_naming_it() {
    let missing = tmp("no-such-dir");
    let out = zerohop(&["info", missing.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(missing.to_str().unwrap()) && err.contains("No such file"),
        "{err}"
    );
}

/// Text output on host memory says what happened there (no pinning), sizes
/// read as sizes, and `checkpoint ls` has column headers.
#[test]
fn text_output_is_true_to_host_memory_and_human() {
    let model = tmp("human.safetensors");
    let m = model.to_str().unwrap();
    assert!(zerohop(&["gen", "--size", "2MiB", m]).status.success());
    let out = zerohop(&["load", m, "--device", "host"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("not pinned") && !stdout.contains("pinned slots"),
        "{stdout}"
    );
    // The first transfer allocates the whole 128 MiB pool, one block, even
    // for one window: what was held, as a size.
    assert!(stdout.contains(" 128 MiB staging"), "{stdout}");

    let ck = tmp("human-ckpt");
    let out = zerohop(&[
        "checkpoint",
        "save",
        "--device",
        "host",
        "--from",
        m,
        ck.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = zerohop(&["checkpoint", "ls", ck.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    let mut lines = stdout.lines().skip(1);
    let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["SIZE", "TYPE", "NAME"], "{stdout}");
    let first: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert!(first[1].ends_with("iB") || first[1] == "B", "{stdout}");
    assert!(first[0].parse::<f64>().is_ok(), "{stdout}");
}

#[test]
fn first_hour_mistakes_are_clear_errors_that_lose_nothing() {
    // gen never replaces a file unless told to.
    let model = tmp("kept.safetensors");
    let m = model.to_str().unwrap();
    assert!(zerohop(&["gen", "--size", "1MiB", m]).status.success());
    let before = std::fs::read(&model).unwrap();
    fails_with(&["gen", "--size", "2MiB", "--seed", "9", m], "--force");
    assert_eq!(std::fs::read(&model).unwrap(), before, "the file changed");
    assert!(zerohop(&["gen", "--size", "2MiB", "--force", m])
        .status
        .success());
    assert_ne!(std::fs::read(&model).unwrap(), before);
    // A size of 0 bytes is no size.
    fails_with(
        &[
            "gen",
            "--size",
            "0",
            tmp("zero.safetensors").to_str().unwrap(),
        ],
        "0 bytes",
    );
    // A file whose size the kernel does not know is refused, not loaded as 0 bytes.
    fails_with(
        &["load", "/proc/self/status", "--device", "host"],
        "size reads as 0 bytes",
    );
    // A missing file is the error, before anything is said about the device.
    let out = zerohop(&["load", tmp("missing.safetensors").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("missing.safetensors"), "{err}");
    assert!(
        !err.contains("no GPU"),
        "the device was opened first: {err}"
    );
}

/// `zerohop checkpoint` against a real S3-compatible server (s3s-fs, as
/// the object store tests start it), configured through the AWS_*
/// variables as a user would.
mod object_store {
    use super::common;
    use super::s3::{Server, KEY_ID, SECRET};
    use std::path::Path;
    use std::process::{Command, Output};

    fn zerohop(server: &Server, args: &[&str]) -> Output {
        let nowhere = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-aws-files");
        Command::new(env!("CARGO_BIN_EXE_zerohop"))
            .args(args)
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_CONFIG_FILE", &nowhere)
            .env("AWS_SHARED_CREDENTIALS_FILE", &nowhere)
            .output()
            .expect("zerohop runs")
    }

    /// Runs and succeeds; its standard output.
    fn ok(server: &Server, args: &[&str]) -> String {
        let out = zerohop(server, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Fails with a clear error naming `needle`, without panicking.
    fn fails_with(server: &Server, args: &[&str], needle: &str) {
        common::assert_clear_failure(&zerohop(server, args), args, needle);
    }

    #[test]
    fn checkpoints_save_list_verify_restore_and_remove_in_an_object_store() {
        let server = Server::start("cli-ckpt");
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-s3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.safetensors");
        let m = model.to_str().unwrap();
        ok(&server, &["gen", "--size", "24MiB", m]);
        let host = ["--device", "host"];
        let save = |name: &str, extra: &[&str]| {
            let at = format!("s3://models/ck/{name}");
            // One data file: parts without its header can be copied.
            let args: Vec<&str> = ["checkpoint", "save", "--from", m, &at, "--shards", "1"]
                .into_iter()
                .chain(host)
                .chain(extra.iter().copied())
                .collect();
            ok(&server, &args)
        };
        let first = save("a", &[]);
        assert!(first.contains("s3://models/ck/a"), "{first}");
        // The same tensors against a parent: every part but those holding a
        // header is copied by the server.
        let second = save("b", &["--parent", "s3://models/ck/a"]);
        assert!(second.contains("unchanged"), "{second}");
        assert!(second.contains("the server copied those parts"), "{second}");

        let listed = ok(&server, &["checkpoint", "ls", "s3://models/ck/"]);
        assert!(listed.contains("2 checkpoints"), "{listed}");
        assert!(
            listed
                .lines()
                .any(|l| l.contains(" b ") && l.ends_with(" a")),
            "{listed}"
        );
        let entries = ok(&server, &["checkpoint", "ls", "s3://models/ck/b"]);
        assert!(
            entries.contains("chunks are stored in parent checkpoints"),
            "{entries}"
        );
        let verified = ok(&server, &["checkpoint", "verify", "s3://models/ck/b"]);
        assert!(verified.starts_with("ok: "), "{verified}");
        let restored = ok(
            &server,
            &[
                "checkpoint",
                "restore",
                "s3://models/ck/b",
                "--against",
                m,
                "--device",
                "host",
            ],
        );
        assert!(restored.contains("contents match the files"), "{restored}");

        fails_with(
            &server,
            &["checkpoint", "rm", "s3://models/ck/a"],
            "still needed by checkpoint(s) b",
        );
        fails_with(
            &server,
            &[
                "checkpoint",
                "save",
                "--from",
                m,
                "s3://models/ck/a",
                "--device",
                "host",
            ],
            "already exists",
        );
        fails_with(
            &server,
            &[
                "checkpoint",
                "restore",
                "s3://models/ck/none",
                "--device",
                "host",
            ],
            "not a checkpoint",
        );
        fails_with(
            &server,
            &["checkpoint", "rm", "--unfinished", "s3://models/ck/b"],
            "is a committed checkpoint",
        );
        ok(&server, &["checkpoint", "rm", "s3://models/ck/b"]);
        ok(&server, &["checkpoint", "rm", "s3://models/ck/a"]);
        assert!(
            server.client().list("ck/").unwrap().is_empty(),
            "nothing left"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
