//! The `zerohop` binary end to end on host memory: happy paths, and bad
//! input that must give a clear error and a non-zero exit, never a panic.

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
    let out = zerohop(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        err.contains("error") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
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
    assert!(
        v["path"].as_str().unwrap().contains("staged")
            || v["path"].as_str().unwrap().contains("DMA")
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
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
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
/// see a real permission error.
#[test]
fn unreadable_file_is_a_permission_error() {
    use std::os::unix::fs::PermissionsExt;
    let secret = tmp("secret.safetensors");
    std::fs::write(&secret, b"x").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let args = ["load", secret.to_str().unwrap(), "--device", "host"];
    // SAFETY: geteuid has no preconditions.
    let out = if unsafe { libc::geteuid() } == 0 {
        let bin = env!("CARGO_BIN_EXE_zerohop");
        let privs = ["--reuid=65534", "--regid=65534", "--clear-groups", bin];
        match Command::new("setpriv").args(privs).args(args).output() {
            Ok(out) => out,
            Err(e) => {
                eprintln!("skipped: running as root without setpriv ({e})");
                return;
            }
        }
    } else {
        zerohop(&args)
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("setpriv:") {
        eprintln!("skipped: setpriv cannot run zerohop as nobody here: {err}");
        return;
    }
    assert!(!out.status.success());
    assert!(
        err.contains("Permission denied") && !err.contains("panicked"),
        "{err}"
    );
}

/// `bench checkpoint` on host memory: saves, restores, compares, and
/// reports its rates beside the directory's raw rates.
#[test]
fn bench_checkpoint_round_trips_on_host() {
    let dir = tmp("bench-ckpt");
    let out = zerohop(&[
        "bench",
        "checkpoint",
        "--size",
        "24MiB",
        "--region",
        "5MiB",
        "--device",
        "host",
        "--json",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["contents_match"], true);
    assert_eq!(v["bytes"], 24 << 20);
    for k in [
        "save_gbps",
        "restore_gbps",
        "save_ratio_to_raw_write",
        "restore_ratio_to_raw_read",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    // The checkpoint and the raw files are gone afterwards.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}
