//! A real S3-compatible server for tests (s3s-fs, a Rust crate: it keeps
//! objects as files, so it can be killed and started again over the same
//! data), and a proxy in front of it that injects the faults a network and
//! a busy server cause: 503 SlowDown answers and connections cut mid-body.
#![allow(dead_code)] // each test file uses part of this

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop::staging::StagingConfig;
use zerohop::{Device, Engine, EngineConfig};
use zerohop_s3::{AddressingStyle, RetryPolicy, S3Client, S3Config};

pub const KEY_ID: &str = "zerohop-test";
pub const SECRET: &str = "zerohop-test-secret";
pub const BUCKET: &str = "models";
/// The smallest part but the last that S3 accepts.
pub const MIN: usize = zerohop_s3::MIN_PART_BYTES;

/// An engine on `device` with slots of S3's smallest part, three workers.
pub fn upload_engine(device: Arc<dyn Device>) -> Engine {
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 6 * MIN,
            slot_bytes: MIN,
        },
        io_threads: 3,
        ..EngineConfig::default()
    };
    Engine::new(device, config).unwrap()
}

/// The server binary: `ZEROHOP_S3_SERVER`, else `s3s-fs` on the PATH.
/// scripts/test.sh installs it (and says how).
fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ZEROHOP_S3_SERVER") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("s3s-fs"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "these tests need an S3 server: scripts/test.sh installs one \
             (cargo install s3s-fs@0.14.1 --features binary --locked), or set ZEROHOP_S3_SERVER"
        )
    })
}

/// An s3s-fs server on a free loopback port, over a directory of its own
/// with one bucket, [`BUCKET`]. Killed when dropped.
pub struct Server {
    pub root: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

impl Server {
    pub fn start(name: &str) -> Server {
        let root = std::env::temp_dir().join(format!("zerohop-s3-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        let port = free_port();
        let mut s = Server {
            root,
            port,
            child: None,
        };
        s.run();
        s
    }

    /// Starts the server process (again, after [`Server::kill`]) on the
    /// same port and data.
    pub fn run(&mut self) {
        let child = Command::new(server_binary())
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", KEY_ID, "--secret-key", SECRET])
            .arg(&self.root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the S3 server");
        let child = self.child.insert(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the S3 server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        // What answered is this server, not a listener that took the port
        // first (the server would then have exited, unable to bind it).
        std::thread::sleep(Duration::from_millis(20));
        let exited = child.try_wait().expect("the S3 server's status");
        assert!(
            exited.is_none(),
            "the S3 server exited ({exited:?}): port {} taken?",
            self.port
        );
    }

    /// Kills the server process at once (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server process's id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    pub fn config(&self) -> S3Config {
        config_for(&self.endpoint())
    }

    pub fn client(&self) -> S3Client {
        S3Client::new(&self.config(), BUCKET).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The test server's settings for `endpoint`, retrying quickly.
pub fn config_for(endpoint: &str) -> S3Config {
    S3Config {
        endpoint: endpoint.to_string(),
        region: "us-east-1".into(),
        credentials: Some((KEY_ID.into(), SECRET.into(), None)),
        addressing: AddressingStyle::Path,
        retry: RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
        },
    }
}

/// A free loopback port for a server to bind later: one below the kernel's
/// ephemeral range (32768 on), which neither `bind` to port 0 nor an
/// outgoing connection ever takes meanwhile, as they could a port that
/// `bind` to port 0 handed out and gave back. Each test process counts from
/// a base of its own, so concurrent ones seldom try the same ports.
fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 200) as u16 * 100;
    for _ in 0..100 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 100;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {base}..{}", base + 100);
}

/// What the proxy does to the connections it accepts next.
#[derive(Default)]
pub struct Faults {
    /// This many connections are answered `503 SlowDown` and closed.
    pub slow_down: AtomicUsize,
    /// This many connections are cut after `cut_after` response bytes.
    pub cuts: AtomicUsize,
    pub cut_after: AtomicU64,
    /// This many answers, on any connection, are cut after a few bytes
    /// (connections are pooled: this reaches those already open).
    pub cut_answers: AtomicUsize,
    /// Connections accepted so far.
    pub accepted: AtomicUsize,
    /// GET requests relayed so far.
    pub gets: AtomicUsize,
}

/// A TCP proxy to a server that injects [`Faults`].
pub struct FaultProxy {
    pub port: u16,
    pub faults: Arc<Faults>,
}

impl FaultProxy {
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                f.accepted.fetch_add(1, Ordering::SeqCst);
                if take(&f.slow_down) {
                    std::thread::spawn(move || slow_down(conn));
                } else {
                    let cut = take(&f.cuts).then(|| f.cut_after.load(Ordering::SeqCst));
                    let f = f.clone();
                    std::thread::spawn(move || forward(conn, upstream, cut, &f));
                }
            }
        });
        FaultProxy { port, faults }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Reads one request's head and answers as S3 does when throttling.
fn slow_down(mut conn: TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
        head.push(byte[0]);
    }
    let body = if head.starts_with(b"HEAD ") {
        ""
    } else {
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    };
    let reply = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(reply.as_bytes());
    let _ = conn.shutdown(Shutdown::Both);
}

/// Takes one from `n` if it is not zero.
fn take(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// Relays a connection; with `cut`, closes it after that many bytes of the
/// server's responses, and whenever `faults` asks to cut an answer.
fn forward(client: TcpStream, upstream: u16, cut: Option<u64>, faults: &Arc<Faults>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let counts = faults.clone();
    std::thread::spawn(move || {
        count_gets(&mut c_read, &mut s_write, &counts.gets);
        let _ = s_write.shutdown(Shutdown::Write);
    });
    let (mut s_read, mut c_write) = (server, client);
    let mut sent = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match s_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let allowed = cut.map_or(n as u64, |c| (c - sent).min(n as u64)) as usize;
        if take(&faults.cut_answers) {
            let _ = c_write.write_all(&buf[..allowed.min(12)]);
            break;
        }
        if c_write.write_all(&buf[..allowed]).is_err() {
            break;
        }
        sent += allowed as u64;
        if cut.is_some_and(|c| sent >= c) {
            break;
        }
    }
    let _ = c_write.shutdown(Shutdown::Both);
    let _ = s_read.shutdown(Shutdown::Both);
}

/// Relays requests from `from` to `to`, counting in `gets` those that are
/// GETs (a request line starts `GET /`; GETs carry no body to confuse it).
fn count_gets(from: &mut TcpStream, to: &mut TcpStream, gets: &AtomicUsize) {
    const MARK: &[u8] = b"GET /";
    let mut buf = vec![0u8; 64 << 10];
    // The last bytes of the previous read, where a mark may have begun.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        carry.extend_from_slice(&buf[..n]);
        let found = carry.windows(MARK.len()).filter(|w| *w == MARK).count();
        gets.fetch_add(found, Ordering::SeqCst);
        carry.drain(..carry.len().saturating_sub(MARK.len() - 1));
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// `len` bytes that differ with `seed` and along the object.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i as u8) ^ seed)
        .collect()
}
