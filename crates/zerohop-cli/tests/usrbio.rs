//! USRBIO programs (crates/zerohop-usrbio/tests/usrbio.c, written against
//! its hf3fs_usrbio.h) linked with libhf3fs_api_shared.so, against a real
//! `zerohop agent` serving a directory. Host memory; the GPU half runs in
//! python/tests/test_usrbio.py on a GPU machine.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{compile_c, pattern, Agent, TempDir, USRBIO_LIBRARY};

struct Setup {
    agent: Agent,
    dir: TempDir,
    mount: PathBuf,
    exe: PathBuf,
    lib_dir: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = TempDir::new("usrbio");
        let mount = std::fs::canonicalize(&dir.0).unwrap().join("served");
        std::fs::create_dir(&mount).unwrap();
        let exe = dir.0.join("usrbio");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerohop-usrbio/tests/usrbio.c");
        let lib_dir = compile_c(&source, &exe, &USRBIO_LIBRARY);
        let agent = Agent::start(&["--serve", mount.to_str().unwrap()]);
        Setup {
            agent,
            dir,
            mount,
            exe,
            lib_dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(args)
            .env("LD_LIBRARY_PATH", &self.lib_dir)
            .env("ZEROHOP_AGENT_SOCKET", &self.agent.socket)
            .env("ZEROHOP_IOV_DIR", self.dir.0.join("iovs"));
        c
    }

    fn file(&self, name: &str, len: usize) -> String {
        let path = self.mount.join(name);
        std::fs::write(&path, pattern(len, len as u8)).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn run(&self, test: &str, file: &str) {
        let out = self
            .command(&[test, self.mount.to_str().unwrap(), file])
            .output()
            .unwrap();
        assert_ok(test, &out);
    }
}

fn assert_ok(test: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{test}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn usrbio_programs_read_write_and_batch_through_the_agent() {
    let s = Setup::new();
    s.run("read", &s.file("model.bin", 5_000_003));
    s.run("write", &s.mount.join("written.bin").to_string_lossy());
    s.run("depth", &s.file("small.bin", 64 * 4096));
    s.run("closed", &s.file("closed.bin", 1_000_001));
    s.run("errors", &s.file("errors.bin", 3 * 4096 + 5));
}

#[test]
fn an_iov_is_opened_by_its_id_from_another_process() {
    let s = Setup::new();
    let file = s.file("shared.bin", 2_000_017);
    let mount = s.mount.to_str().unwrap();
    let mut publisher = s
        .command(&["publish", mount, &file])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut id = String::new();
    BufReader::new(publisher.stdout.as_mut().unwrap())
        .read_line(&mut id)
        .unwrap();
    assert_eq!(id.trim().len(), 32, "publisher printed {id:?}");
    let opener = s
        .command(&["open", mount, &file, id.trim()])
        .output()
        .unwrap();
    assert_ok("open", &opener);
    publisher
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    assert_ok("publish", &publisher.wait_with_output().unwrap());
}

#[test]
fn the_agent_refuses_files_outside_what_it_serves() {
    let s = Setup::new();
    let outside = s.dir.0.join("outside.bin");
    std::fs::write(&outside, b"not served").unwrap();
    let client = s.agent.client();
    let err = client
        .register_file(std::fs::File::open(&outside).unwrap())
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    let inside = std::fs::File::open(s.file("inside.bin", 10)).unwrap();
    client.register_file(inside).unwrap();
    let status = zerohop_agent::query_status(&s.agent.socket).unwrap();
    assert_eq!(status.served, vec![s.mount.to_string_lossy().to_string()]);
}

#[test]
fn the_library_loads_and_fails_cleanly_with_no_agent() {
    let s = Setup::new();
    let file = s.file("lonely.bin", 4096);
    let out = s
        .command(&["lonely", s.mount.to_str().unwrap(), &file])
        .env("ZEROHOP_AGENT_SOCKET", s.dir.0.join("nobody.sock"))
        .output()
        .unwrap();
    assert_ok("lonely", &out);
}
