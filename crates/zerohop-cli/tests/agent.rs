//! The I/O agent as its clients see it: a real `zerohop agent` process,
//! clients in this process (and in child processes that get killed).
//! Host buffers and simulated device buffers; no GPU needed.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use zerohop_client::{Client, Submission};
use zerohop_wire::control::{self, Reply, Request};
use zerohop_wire::ring::{OP_READ, OP_WRITE};
use zerohop_wire::{shm::SharedMemory, socket};

mod common;
use common::{compile_c, pattern, Agent, TempDir, CLIENT_LIBRARY};

// The tests read client buffers only after their I/O completed, which is
// what `HostBuffer::as_slice` asks (its `unsafe` blocks below rely on it).

fn rw_file(path: &Path, contents: &[u8]) -> File {
    std::fs::write(path, contents).unwrap();
    File::options().read(true).write(true).open(path).unwrap()
}

#[test]
fn host_and_simulated_device_buffers_round_trip() {
    let agent = Agent::start(&[]);
    let dir = TempDir::new("rt");
    let data = pattern((3 << 20) + 4321, 1);
    let src = rw_file(&dir.0.join("src"), &data);
    let dst = rw_file(&dir.0.join("dst"), &[]);
    let c = agent.client();
    let (src_id, dst_id) = (
        c.register_file(&src).unwrap(),
        c.register_file(&dst).unwrap(),
    );
    let host = c.create_host_buffer(data.len()).unwrap();
    let sim = c.create_simulated_device_buffer(data.len()).unwrap();
    let mut ring = c.create_ring(128).unwrap();
    // Odd-sized pieces: file -> host buffer, host buffer -> dst, dst -> sim.
    let cuts: Vec<(u64, u64)> = {
        let mut at = 0u64;
        let mut v = Vec::new();
        let mut n = 1u64;
        while at < data.len() as u64 {
            let len = (n * 37_777 % 300_001 + 1).min(data.len() as u64 - at);
            v.push((at, len));
            at += len;
            n += 1;
        }
        v
    };
    assert!(cuts.len() < 128);
    for (step, (file, buf, op)) in [
        (src_id, &host, OP_READ),
        (dst_id, &host, OP_WRITE),
        (dst_id, &sim, OP_READ),
    ]
    .into_iter()
    .enumerate()
    {
        for (i, &(at, len)) in cuts.iter().enumerate() {
            ring.prepare(Submission::raw(
                op,
                file,
                at,
                buf.id(),
                at,
                len,
                (step * 1000 + i) as u64,
            ))
            .unwrap();
        }
        ring.submit().unwrap();
        let done = ring
            .wait(cuts.len(), Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(done.len(), cuts.len());
        for c in &done {
            let (_, len) = cuts[c.user_data as usize % 1000];
            assert_eq!(c.result, len as i64, "entry {}", c.user_data);
        }
    }
    assert_eq!(unsafe { host.as_slice() }, &data[..]);
    assert_eq!(unsafe { sim.as_slice() }, &data[..]);
    assert_eq!(std::fs::read(dir.0.join("dst")).unwrap(), data);
    let st = agent.client_status();
    assert_eq!(
        (
            st[0].files,
            st[0].host_buffers,
            st[0].device_buffers,
            st[0].rings
        ),
        (2, 1, 1, 1)
    );
}

#[test]
fn bad_entries_get_error_completions_and_the_session_goes_on() {
    let agent = Agent::start(&[]);
    let dir = TempDir::new("bad");
    let f = rw_file(&dir.0.join("f"), &pattern(10_000, 2));
    let c = agent.client();
    let file = c.register_file(&f).unwrap();
    let buf = c.create_host_buffer(8192).unwrap();
    let mut ring = c.create_ring(16).unwrap();
    // (op, file, buffer, file offset, buffer offset, length) -> result
    type Entry = (u8, u32, u32, u64, u64, u64);
    let b = buf.id();
    let cases: Vec<(Entry, i64)> = vec![
        ((7, file, b, 0, 0, 10), -(libc::EINVAL as i64)),
        ((OP_READ, 999, b, 0, 0, 10), -(libc::EBADF as i64)),
        ((OP_READ, file, 999, 0, 0, 10), -(libc::EBADF as i64)),
        ((OP_READ, file, b, 0, 8000, 1000), -(libc::EFAULT as i64)),
        ((OP_READ, file, b, 0, u64::MAX, 2), -(libc::EFAULT as i64)),
        (
            (OP_READ, file, b, u64::MAX - 1, 0, 10),
            -(libc::EFAULT as i64),
        ),
        ((OP_READ, file, b, 0, 0, 1 << 40), -(libc::E2BIG as i64)),
        ((OP_READ, file, b, 9_000, 0, 2_000), -(libc::EINVAL as i64)), // past the end of the file
        ((OP_READ, file, b, 0, 0, 4096), 4096),
    ];
    for (i, &((op, f, bb, foff, boff, len), _)) in cases.iter().enumerate() {
        ring.prepare(Submission::raw(op, f, foff, bb, boff, len, i as u64))
            .unwrap();
    }
    ring.submit().unwrap();
    let done = ring
        .wait(cases.len(), Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(done.len(), cases.len());
    for c in done {
        assert_eq!(
            c.result, cases[c.user_data as usize].1,
            "case {}",
            c.user_data
        );
    }
    assert_eq!(
        &unsafe { buf.as_slice() }[..4096],
        &pattern(10_000, 2)[..4096]
    );
    assert!(agent.client_status()[0].errors >= 8);
}

/// Sends raw bytes (and descriptors) as one control message; the reply.
fn exchange(conn: &impl AsFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Reply {
    control::send(conn, bytes, fds).unwrap();
    let (reply, _) = control::recv(conn).unwrap().expect("a reply");
    control::decode_reply(&reply).unwrap()
}

fn code(r: Reply) -> i32 {
    match r {
        Reply::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn malformed_control_messages_are_refused_and_the_session_goes_on() {
    let agent = Agent::start(&[]);
    let dir = TempDir::new("ctl");
    let conn = socket::connect(&agent.socket).unwrap();
    let plain = rw_file(&dir.0.join("plain"), b"not a memfd");
    let hello = control::encode(&Request::Hello {
        version: zerohop_wire::PROTOCOL_VERSION,
        pid: 1,
    });
    // Before hello: only status.
    assert_eq!(
        code(exchange(
            &conn,
            &control::encode(&Request::RegisterFile),
            &[plain.as_fd()]
        )),
        libc::EPROTO
    );
    assert!(matches!(
        exchange(&conn, &control::encode(&Request::Status), &[]),
        Reply::Status(_)
    ));
    assert_eq!(
        code(exchange(
            &conn,
            &control::encode(&Request::Hello {
                version: 99,
                pid: 1
            }),
            &[]
        )),
        libc::EPROTO
    );
    assert!(matches!(exchange(&conn, &hello, &[]), Reply::Ok { .. }));
    // Garbage, unknown fields, wrong descriptor counts, unsealed memory.
    assert_eq!(
        code(exchange(&conn, b"\xff\xfe garbage", &[])),
        libc::EINVAL
    );
    assert_eq!(
        code(exchange(
            &conn,
            br#"{"register_ring":{"entries":8,"evil":1}}"#,
            &[]
        )),
        libc::EINVAL
    );
    assert_eq!(
        code(exchange(
            &conn,
            &control::encode(&Request::RegisterFile),
            &[]
        )),
        libc::EINVAL
    );
    let host = control::encode(&Request::RegisterHostBuffer { len: 4 });
    assert_eq!(code(exchange(&conn, &host, &[plain.as_fd()])), libc::EINVAL);
    let shm = SharedMemory::create("small", 4096).unwrap();
    let big = control::encode(&Request::RegisterHostBuffer { len: 1 << 20 });
    assert_eq!(
        code(exchange(&conn, &big, &[shm.file().as_fd()])),
        libc::EINVAL,
        "memfd smaller than claimed"
    );
    let ring = control::encode(&Request::RegisterRing { entries: 8 });
    let fds = [shm.file().as_fd(), plain.as_fd(), plain.as_fd()];
    assert_eq!(
        code(exchange(&conn, &ring, &fds)),
        libc::EINVAL,
        "wake-ups must be eventfds"
    );
    let odd = control::encode(&Request::RegisterRing { entries: 6 });
    assert_eq!(code(exchange(&conn, &odd, &fds)), libc::EINVAL);
    let dev = control::encode(&Request::RegisterCudaIpc {
        device: 0,
        handle: "00".repeat(64),
        offset: 0,
        len: 1,
    });
    assert_eq!(
        code(exchange(&conn, &dev, &[])),
        libc::EINVAL,
        "no GPU served"
    );
    assert_eq!(
        code(exchange(
            &conn,
            &control::encode(&Request::DeregisterBuffer { id: 77 }),
            &[]
        )),
        libc::EBADF
    );
    // An O_PATH descriptor grants no I/O (reopening it would use the
    // agent's rights), and a directory is not a file to read.
    let path_only = {
        use std::os::unix::fs::OpenOptionsExt;
        File::options()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(dir.0.join("plain"))
            .unwrap()
    };
    let reg = control::encode(&Request::RegisterFile);
    assert_eq!(
        code(exchange(&conn, &reg, &[path_only.as_fd()])),
        libc::EINVAL
    );
    let d = File::open(&dir.0).unwrap();
    assert_eq!(
        code(exchange(
            &conn,
            &control::encode(&Request::RegisterFile),
            &[d.as_fd()]
        )),
        libc::EINVAL
    );
    // Still served.
    assert!(matches!(
        exchange(
            &conn,
            &control::encode(&Request::RegisterFile),
            &[plain.as_fd()]
        ),
        Reply::Ok { id: Some(_) }
    ));
    assert_eq!(agent.client_status()[0].files, 1);
}

#[test]
fn a_scribbled_ring_ends_only_that_session() {
    let agent = Agent::start(&[]);
    let dir = TempDir::new("scribble");
    let data = pattern(1 << 20, 3);
    let f = rw_file(&dir.0.join("f"), &data);
    let (bad, good) = (agent.client(), agent.client());
    let mut bad_ring = bad.create_ring(8).unwrap();
    let _b = bad.create_host_buffer(4096).unwrap();
    bad_ring.corrupt_tail(1_000_000);
    agent.wait_for_clients(1);
    assert!(bad.status().is_err(), "the broken session is closed");
    let waited = bad_ring.wait(1, Some(Duration::from_secs(10))).unwrap_err();
    assert_eq!(
        waited.kind(),
        std::io::ErrorKind::ConnectionAborted,
        "{waited}"
    );
    let file = good.register_file(&f).unwrap();
    let buf = good.create_host_buffer(data.len()).unwrap();
    let mut ring = good.create_ring(8).unwrap();
    ring.prepare(Submission::read(file, 0, &buf, 0, data.len() as u64, 1))
        .unwrap();
    ring.submit().unwrap();
    assert_eq!(
        ring.wait(1, Some(Duration::from_secs(20))).unwrap()[0].result,
        data.len() as i64
    );
    assert_eq!(unsafe { buf.as_slice() }, &data[..]);
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The agent's descriptor count once it stops changing (the sessions of
/// status queries close their sockets a moment after answering).
fn settled_fd_count(pid: u32) -> usize {
    let mut last = fd_count(pid);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = fd_count(pid);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Shared-memory mappings (clients' memfds) in the agent. Thread stacks
/// are left out: the C library keeps freed ones for reuse.
fn memfd_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:"))
        .count()
}

/// The body of a client process that the test below kills mid-batch: no
/// test of its own, so ignored; the parent runs it with `--ignored`.
#[test]
#[ignore = "a child process's body: clients_that_leave_or_die_leak_nothing runs it"]
fn zz_child_client() {
    let sock = std::env::var("ZEROHOP_TEST_CHILD_SOCKET").expect(
        "run only by clients_that_leave_or_die_leak_nothing, which names the agent's socket",
    );
    let path = PathBuf::from(std::env::var("ZEROHOP_TEST_CHILD_FILE").unwrap());
    let c = Client::connect(Path::new(&sock)).unwrap();
    let f = File::open(&path).unwrap();
    let file = c.register_file(&f).unwrap();
    let host = c.create_host_buffer(64 << 20).unwrap();
    let sim = c.create_simulated_device_buffer(64 << 20).unwrap();
    let mut ring = c.create_ring(256).unwrap();
    for round in 0.. {
        for i in 0..256u64 {
            let buf = if i % 2 == 0 { &host } else { &sim };
            let at = (i % 64) << 20;
            ring.prepare(Submission::read(
                file,
                at,
                buf,
                at,
                1 << 20,
                round * 256 + i,
            ))
            .unwrap();
        }
        ring.submit().unwrap();
        println!("submitted");
        ring.wait(256, Some(Duration::from_secs(30))).unwrap();
    }
}

#[test]
fn clients_that_leave_or_die_leak_nothing() {
    let agent = Agent::start(&[]);
    let dir = TempDir::new("leak");
    let path = dir.0.join("f");
    std::fs::write(&path, pattern(64 << 20, 4)).unwrap();
    // Warm up the agent's engines (staging pools, threads) once.
    {
        let c = agent.client();
        let f = File::open(&path).unwrap();
        let id = c.register_file(&f).unwrap();
        let b = c.create_simulated_device_buffer(1 << 20).unwrap();
        let mut r = c.create_ring(8).unwrap();
        r.prepare(Submission::read(id, 0, &b, 0, 1 << 20, 0))
            .unwrap();
        r.submit().unwrap();
        assert_eq!(
            r.wait(1, Some(Duration::from_secs(20))).unwrap()[0].result,
            1 << 20
        );
    }
    agent.wait_for_clients(0);
    let (fds, maps) = (settled_fd_count(agent.pid()), memfd_mappings(agent.pid()));
    assert_eq!(maps, 0);
    for _ in 0..3 {
        // A client that leaves politely, with everything registered.
        {
            let c = agent.client();
            let f = File::open(&path).unwrap();
            c.register_file(&f).unwrap();
            let _h = c.create_host_buffer(8 << 20).unwrap();
            let _s = c.create_simulated_device_buffer(8 << 20).unwrap();
            let _r = c.create_ring(64).unwrap();
            assert_eq!(agent.clients(), 1);
            assert_eq!(
                memfd_mappings(agent.pid()),
                3,
                "two buffers and a ring mapped"
            );
        }
        agent.wait_for_clients(0);
        // A client process killed in the middle of a batch.
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "zz_child_client",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("ZEROHOP_TEST_CHILD_SOCKET", &agent.socket)
            .env("ZEROHOP_TEST_CHILD_FILE", &path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The harness prints its own lines first ("running 1 test", the
        // test's name): the kill must come after a batch is in flight.
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut lines = std::io::BufRead::lines(out);
        let submitted = lines.any(|l| l.unwrap().ends_with("submitted"));
        assert!(
            submitted,
            "the child client exited before submitting a batch"
        );
        std::thread::sleep(Duration::from_millis(20));
        child.kill().unwrap();
        child.wait().unwrap();
        agent.wait_for_clients(0);
        assert_eq!(
            settled_fd_count(agent.pid()),
            fds,
            "descriptors back to the baseline"
        );
        assert_eq!(memfd_mappings(agent.pid()), maps, "shared memory unmapped");
    }
}

#[test]
fn sigterm_completes_submitted_io_then_exits() {
    let mut agent = Agent::start(&[]);
    let dir = TempDir::new("term");
    let data = pattern(32 << 20, 5);
    let f = rw_file(&dir.0.join("f"), &data);
    let c = agent.client();
    let file = c.register_file(&f).unwrap();
    let buf = c.create_simulated_device_buffer(data.len()).unwrap();
    let mut ring = c.create_ring(64).unwrap();
    for i in 0..32u64 {
        ring.prepare(Submission::read(file, i << 20, &buf, i << 20, 1 << 20, i))
            .unwrap();
    }
    ring.submit().unwrap();
    // SAFETY: signals the agent child.
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    let done = ring.wait(32, Some(Duration::from_secs(30))).unwrap();
    assert_eq!(done.len(), 32, "every submitted I/O completed");
    assert!(done.iter().all(|c| c.result == 1 << 20));
    assert_eq!(unsafe { buf.as_slice() }, &data[..]);
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!agent.socket.exists(), "socket removed");
}

#[test]
fn the_socket_is_private_and_one_agent_owns_it() {
    let agent = Agent::start(&[]);
    let mode = std::fs::metadata(&agent.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let second = Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(["agent", "--device", "host", "--socket"])
        .arg(&agent.socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("already serving"));
    let group = Agent::start(&["--group"]);
    assert_eq!(
        std::fs::metadata(&group.socket)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o660
    );
    let status = Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(["agent", "status", "--socket"])
        .arg(&agent.socket)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&status.stdout).contains("clients  0"));
}

#[test]
fn the_c_example_copies_a_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../zerohop-client");
    let dir = TempDir::new("c");
    let exe = dir.0.join("copy_file");
    let lib_dir = compile_c(&root.join("examples/c/copy_file.c"), &exe, &CLIENT_LIBRARY);
    let agent = Agent::start(&[]);
    let data = pattern(3_000_001, 6);
    std::fs::write(dir.0.join("src"), &data).unwrap();
    let run = Command::new(&exe)
        .arg(&agent.socket)
        .arg(dir.0.join("src"))
        .arg(dir.0.join("dst"))
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(std::fs::read(dir.0.join("dst")).unwrap(), data);
}

/// Registers a negative descriptor, a closed one, an open one, and the open
/// one again; prints the four return codes.
const REG_FD_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include "zerohop.h"
int main(int argc, char **argv) {
    zh_client *c;
    int rc = argc == 3 ? zh_client_connect(argv[1], &c) : -1;
    int fd = open(argc == 3 ? argv[2] : "", O_RDONLY);
    if (rc < 0 || fd < 0) return 1;
    int closed = dup(fd);
    close(closed);
    int negative = zh_reg_fd(c, -1);
    int gone = zh_reg_fd(c, closed);
    int first = zh_reg_fd(c, fd);
    int again = zh_reg_fd(c, fd);
    printf("%d %d %d %d\n", negative, gone, first, again);
    zh_client_close(c);
    return 0;
}
"#;

#[test]
fn zh_reg_fd_refuses_negative_closed_and_repeated_descriptors() {
    let dir = TempDir::new("c-reg");
    std::fs::write(dir.0.join("reg_fd.c"), REG_FD_C).unwrap();
    std::fs::write(dir.0.join("data"), b"zerohop").unwrap();
    let exe = dir.0.join("reg_fd");
    let lib_dir = compile_c(&dir.0.join("reg_fd.c"), &exe, &CLIENT_LIBRARY);
    let agent = Agent::start(&[]);
    let run = Command::new(&exe)
        .arg(&agent.socket)
        .arg(dir.0.join("data"))
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        format!("{} {} 0 {}", -libc::EBADF, -libc::EBADF, -libc::EEXIST)
    );
}
