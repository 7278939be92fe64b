//! `zerohop-lab` end to end on host memory (and the simulated device): its
//! benchmarks run, check every byte they move, and refuse bad input
//! clearly. The agent benches start `zerohop agent` from the `zerohop`
//! binary beside `zerohop-lab` (cargo builds both into one directory).

#[path = "../../zerohop-cli/tests/common/mod.rs"]
mod common;
#[path = "../../zerohop-s3/tests/common/mod.rs"]
mod s3;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zerohop-lab"))
        .args(args)
        .output()
        .expect("zerohop-lab runs")
}

/// The `zerohop` binary beside `zerohop-lab`: it makes the test files and
/// serves as the agent.
fn zerohop_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_zerohop-lab")).with_file_name("zerohop");
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test --workspace` builds it (or cargo build -p zerohop-cli)",
        bin.display()
    );
    bin
}

fn zerohop(args: &[&str]) -> Output {
    Command::new(zerohop_binary())
        .args(args)
        .output()
        .expect("zerohop runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lab-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Fails with a message on stderr containing `needle`, without panicking.
fn fails_with(args: &[&str], needle: &str) {
    common::assert_clear_failure(&lab(args), args, needle);
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = tmp(tag);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `zerohop agent` on the simulated device, stopped when dropped.
struct Agent {
    child: Child,
    socket: PathBuf,
    _dir: TempDir,
}

impl Agent {
    fn start() -> Agent {
        let dir = TempDir::new("agent");
        let socket = dir.0.join("agent.sock");
        // Its log goes to a file: a pipe nobody drains could block it.
        let log = dir.0.join("agent.log");
        let mut child = Command::new(zerohop_binary())
            .args(["agent", "--device", "sim", "--socket"])
            .arg(&socket)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the agent did not start: {}\n(the simulated device is in the zerohop binary \
                     that test builds make: `cargo test --workspace`)",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Agent {
            child,
            socket,
            _dir: dir,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs against the S3-compatible server and succeeds; its standard output.
fn ok_s3(server: &s3::Server, args: &[&str]) -> String {
    let nowhere = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-aws-files");
    let out = Command::new(env!("CARGO_BIN_EXE_zerohop-lab"))
        .args(args)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", s3::KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET)
        .env("AWS_CONFIG_FILE", &nowhere)
        .env("AWS_SHARED_CREDENTIALS_FILE", &nowhere)
        .output()
        .expect("zerohop-lab runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_directory_bench_takes_no_rounds_and_writes_nothing() {
    // Rounds alternate with an object store's drifting rate; a directory's
    // bench runs once, and says so before writing anything.
    let bench_dir = tmp("bench-rounds");
    fails_with(
        &[
            "checkpoint",
            "--size",
            "1MiB",
            "--device",
            "host",
            "--rounds",
            "2",
            "--dir",
            bench_dir.to_str().unwrap(),
        ],
        "--rounds is for s3://",
    );
    assert!(!bench_dir.exists());
    fails_with(&["checkpoint", "--size", "0", "--dir", "x"], "0 bytes");
}

#[test]
fn bench_raw_read_reads_every_byte_of_every_file() {
    let (a, b) = (tmp("raw-a.safetensors"), tmp("raw-b.bin"));
    assert!(zerohop(&["gen", "--size", "3MiB", a.to_str().unwrap()])
        .status
        .success());
    std::fs::write(&b, vec![7u8; (1 << 20) + 123]).unwrap();
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for (block, threads, direct) in [
        ("256KiB", "3", "never"),
        ("1000", "1", "never"),
        ("64KiB", "8", "always"),
    ] {
        let args = [
            "raw-read",
            a,
            b,
            "--block",
            block,
            "--threads",
            threads,
            "--direct",
            direct,
            "--json",
        ];
        let out = lab(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        if direct == "always" && err.contains("refuses O_DIRECT") {
            continue; // the file system of the temporary directory does
        }
        assert!(out.status.success(), "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            v["bytes"].as_u64().unwrap(),
            len(Path::new(a)) + len(Path::new(b))
        );
        assert_eq!(v["threads"].as_u64().unwrap().to_string(), threads);
        assert_eq!(v["direct"], direct);
        assert_eq!(v["backend"], "pread");
        assert_eq!(v["files"].as_array().unwrap().len(), 2);
        assert!(v["gbps"].as_f64().unwrap() > 0.0 && v["seconds"].as_f64().unwrap() > 0.0);
        assert!(v["cpu_seconds"].as_f64().unwrap() >= 0.0);
        assert!(v["cache_drop"].is_string());
    }
    let out = lab(&["raw-read", a, "--block", "1MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("GB/s") && text.contains("block 1MiB"),
        "{text}"
    );

    let missing = tmp("raw-missing.bin");
    fails_with(&["raw-read", a, missing.to_str().unwrap()], "No such file");
    fails_with(
        &["raw-read", a, "--direct", "always", "--block", "1000"],
        "multiple of 4096",
    );
    fails_with(&["raw-read", a, "--threads", "0"], "at least 1");
    fails_with(&["raw-read", env!("CARGO_TARGET_TMPDIR")], "directory");
}

/// `bench checkpoint` on host memory: saves, restores, compares, and
/// reports its rates beside the directory's raw rates.
#[test]
fn bench_checkpoint_round_trips_on_host() {
    let dir = tmp("bench-ckpt");
    let out = lab(&[
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

#[test]
fn many_clients_at_once() {
    let dir = TempDir::new("stress");
    // `auto` is the GPU where there is one, else host memory.
    for memory in ["host", "sim", "auto"] {
        let out = Command::new(env!("CARGO_BIN_EXE_zerohop-lab"))
            .args([
                "agent-stress",
                "--clients",
                "6",
                "--ios",
                "400",
                "--device",
                memory,
                "--dir",
            ])
            .arg(&dir.0)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("2400 completed"), "{text}");
    }
}

#[test]
fn a_stress_client_takes_the_common_device_words() {
    let agent = Agent::start();
    let dir = TempDir::new("client-words");
    for memory in ["cpu", "host", "sim"] {
        let out = Command::new(env!("CARGO_BIN_EXE_zerohop-lab"))
            .args(["agent-client", "--ios", "50", "--seed", "3"])
            .args(["--memory", memory, "--socket"])
            .arg(&agent.socket)
            .arg("--file")
            .arg(dir.0.join(memory))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{memory}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["completions"], 50, "{memory}: {report}");
        assert_eq!(report["mismatches"], 0, "{memory}: {report}");
        assert_eq!(report["errors"], 0, "{memory}: {report}");
    }
}

/// `bench checkpoint` against an object store: its limits, save, restore
/// and comparison, and nothing left behind.
#[test]
fn bench_checkpoint_round_trips_on_an_object_store() {
    let server = s3::Server::start("lab-bench-ckpt");
    let out = ok_s3(
        &server,
        &[
            "checkpoint",
            "--size",
            "40MiB",
            "--region",
            "9MiB",
            "--device",
            "host",
            "--json",
            "--rounds",
            "2",
            "--dir",
            "s3://models/bench",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["contents_match"], true);
    assert_eq!(v["part_bytes"], 8 << 20, "S3 parts: slots of 8 MiB");
    for k in [
        "save_ratio_to_raw_upload",
        "save_median_ratio_to_raw_upload",
        "restore_ratio_to_raw_get",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    // Each round: x1 and x2 the I/O threads, then a save.
    assert_eq!(v["raw_upload"].as_array().unwrap().len(), 4);
    assert_eq!(v["save_gbps"].as_array().unwrap().len(), 2);
    assert!(server.client().list("").unwrap().is_empty(), "nothing left");
}
