//! What the CLI's test binaries share: the check of a clear failure, a
//! real `zerohop agent` for tests, and C programs built against the
//! workspace's C libraries. Each test binary uses a part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use zerohop_client::Client;
use zerohop_wire::socket;

/// The `zerohop` binary cargo built for this crate's tests. Optional at
/// compile time: `zerohop-lab`'s tests include this file for its failure
/// check alone.
fn zerohop_binary() -> &'static str {
    match option_env!("CARGO_BIN_EXE_zerohop") {
        Some(path) => path,
        None => panic!("only zerohop-cli's tests have the zerohop binary"),
    }
}

/// `out`, from running the CLI with `args`, is a failure with a clear error
/// naming `needle` on stderr, not a panic.
pub fn assert_clear_failure(out: &Output, args: &[&str], needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        err.contains("error") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

pub struct Agent {
    pub child: Child,
    pub socket: PathBuf,
    _dir: TempDir,
}

impl Agent {
    pub fn start(extra: &[&str]) -> Agent {
        let dir = TempDir::new("agent");
        let socket = dir.0.join("agent.sock");
        let child = Command::new(zerohop_binary())
            .args([
                "agent",
                "--device",
                "sim",
                "--log-level",
                "debug",
                "--socket",
            ])
            .arg(&socket)
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while socket::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "agent did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Agent {
            child,
            socket,
            _dir: dir,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn clients(&self) -> usize {
        self.client_status().len()
    }

    pub fn client_status(&self) -> Vec<zerohop_wire::control::ClientStatus> {
        zerohop_agent::query_status(&self.socket).unwrap().clients
    }

    pub fn wait_for_clients(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.clients() != n {
            assert!(
                Instant::now() < deadline,
                "agent still lists {} clients, not {n}",
                self.clients()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "zerohop-agent-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// A C library of the workspace: its package, its library's name, and the
/// folder of its header.
pub struct CLibrary {
    pub package: &'static str,
    pub name: &'static str,
    pub include: &'static str,
}

pub const CLIENT_LIBRARY: CLibrary = CLibrary {
    package: "zerohop-client",
    name: "zerohop_client",
    include: "../zerohop-client/include",
};

pub const USRBIO_LIBRARY: CLibrary = CLibrary {
    package: "zerohop-usrbio",
    name: "hf3fs_api_shared",
    include: "../zerohop-usrbio/include",
};

/// Builds `lib.so` with the cargo and the profile that built this test
/// (so into the same target directory: nothing is compiled twice) and
/// returns the folder that holds it. A nested cargo cannot deadlock on
/// the target directory's lock: `cargo test` releases it before running
/// tests.
pub fn build_c_library(lib: &CLibrary) -> PathBuf {
    let exe_dir = Path::new(zerohop_binary()).parent().unwrap();
    let profile = match exe_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(name) => name,
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let built = Command::new(env!("CARGO"))
        .args(["build", "--locked", "--lib", "-p", lib.package])
        .args(["--profile", profile, "--message-format", "json"])
        .arg("--manifest-path")
        .arg(&workspace)
        .output()
        .expect("cannot run cargo to build a C library");
    assert!(
        built.status.success(),
        "cargo build -p {} failed:\n{}",
        lib.package,
        String::from_utf8_lossy(&built.stderr)
    );
    let file = format!("lib{}.so", lib.name);
    // Where cargo put it (the target directory and layout are cargo's).
    let library = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == lib.name)
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.file_name().is_some_and(|n| *n == *file))
        .unwrap_or_else(|| panic!("cargo built no {file}"));
    library.parent().unwrap().to_path_buf()
}

/// The C compiler: `$CC`, else `cc`. Its absence is a failure, not a skip:
/// the C ABI is tested only here.
pub fn c_compiler() -> String {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let found = Command::new(&cc).arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "no C compiler ({cc}): the C example test needs one; install gcc or clang \
         (e.g. `apt install gcc`), or point CC at one"
    );
    cc
}

/// Compiles the C program `source` against `lib`'s header and the freshly
/// built library into `exe`; returns the library's folder (for
/// `LD_LIBRARY_PATH`).
pub fn compile_c(source: &Path, exe: &Path, lib: &CLibrary) -> PathBuf {
    let cc = c_compiler();
    let lib_dir = build_c_library(lib);
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join(lib.include);
    let compiled = Command::new(&cc)
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(exe)
        .arg("-I")
        .arg(include)
        .arg(source)
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-l{}", lib.name))
        .output()
        .unwrap();
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    lib_dir
}
