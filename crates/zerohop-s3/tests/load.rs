//! Loads from a real S3-compatible server through the engine (host memory
//! as the device): the bytes arrive, bad input gets one clear error each,
//! throttling and dropped connections are retried within the stated limit,
//! and an object replaced during a load is an error, never mixed bytes.

mod common;

use common::{config_for, pattern, FaultProxy, Server, BUCKET};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use zerohop::device::HostDevice;
use zerohop::plan::TransferPlan;
use zerohop::safetensors::{load_safetensors, load_safetensors_sources, Allocation};
use zerohop::staging::StagingConfig;
use zerohop::{DeviceBuffer, Engine, EngineConfig, ErrorKind};
use zerohop_s3::{expand_objects_with, open_objects_with, RetryPolicy, S3Config};

/// Small slots and three workers: a few MiB make many windows in flight.
fn engine() -> Engine {
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 8 << 16,
            slot_bytes: 1 << 16,
        },
        io_threads: 3,
        ..EngineConfig::default()
    };
    Engine::new(Arc::new(HostDevice::new()), config).unwrap()
}

fn contents(e: &Engine, b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    e.device().read_back(b, 0, &mut v).unwrap();
    v
}

fn url(key: &str) -> String {
    format!("s3://{BUCKET}/{key}")
}

#[test]
fn objects_load_like_files_and_parts_read_only_their_bytes() {
    let server = Server::start("load");
    let data = pattern((3 << 20) + 12345, 1);
    server.client().put("dir/blob.bin", &data, false).unwrap();
    let config = server.config();
    let files = open_objects_with(&config, &[url("dir/blob.bin")]).unwrap();
    assert_eq!(files[0].len(), data.len() as u64);
    let e = engine();
    let (bufs, stats) = e.load_sources(&files, None).unwrap();
    assert!(contents(&e, &bufs[0]) == data, "whole object");
    assert_eq!(stats.remote_bytes, data.len() as u64);
    assert!(stats.path.contains("ranged object reads"), "{}", stats.path);

    // A part of the object, at an odd offset: only those bytes.
    let (at, len) = (1_000_003u64, 777_777u64);
    let dst = e.device().alloc(len as usize).unwrap();
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, at, len, &dst, 0).unwrap();
    let stats = e.transfer(&files, &plan, None).unwrap();
    assert_eq!(stats.remote_bytes, len);
    assert!(contents(&e, &dst) == data[at as usize..(at + len) as usize]);
    // Past the end: refused before any request.
    let mut plan = TransferPlan::new();
    let e2 = plan
        .add(&files, 0, data.len() as u64 - 10, 11, &dst, 0)
        .unwrap_err();
    assert!(e2.to_string().contains("past the end"), "{e2}");
}

#[test]
fn prefixes_and_patterns_name_their_shards_in_order() {
    let server = Server::start("expand");
    let c = server.client();
    for key in [
        "m/b-2.safetensors",
        "m/b-1.safetensors",
        "m/sub/c.safetensors",
        "m/x.json",
    ] {
        c.put(key, b"x", false).unwrap();
    }
    let config = server.config();
    let names = |n: &str| expand_objects_with(&config, &[n.to_string()], ".safetensors");
    assert_eq!(
        names(&url("m/")).unwrap(),
        [
            url("m/b-1.safetensors"),
            url("m/b-2.safetensors"),
            url("m/sub/c.safetensors")
        ]
    );
    assert_eq!(
        names(&url("m/b-*.safetensors")).unwrap(),
        [url("m/b-1.safetensors"), url("m/b-2.safetensors")]
    );
    assert_eq!(names(&url("m/x.json")).unwrap(), [url("m/x.json")]);
    // Local names are not objects (zerohop-names keeps them as they are).
    assert!(names("/local/file").is_err());
    let e = names(&url("m/none-*")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("no object matches"), "{e}");
    // A prefix is not an object.
    let e = open_objects_with(&config, &[url("m/")]).unwrap_err();
    assert!(e.to_string().contains("names no single object"), "{e}");
}

#[test]
fn safetensors_objects_load_as_their_files_do() {
    let server = Server::start("safetensors");
    let dir = std::env::temp_dir().join(format!("zerohop-s3-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    zerohop::safetensors::write_synthetic(&path, 4 << 20, 7, None).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    server
        .client()
        .put("model.safetensors", &bytes, false)
        .unwrap();
    let e = engine();
    let local = load_safetensors(&e, &[&path], Allocation::PerTensor, None).unwrap();
    let files = open_objects_with(&server.config(), &[url("model.safetensors")]).unwrap();
    let remote = load_safetensors_sources(&e, &files, Allocation::PerFile, None).unwrap();
    assert_eq!(remote.tensors.len(), local.tensors.len());
    for (r, l) in remote.tensors.iter().zip(&local.tensors) {
        assert_eq!((&r.name, &r.shape, r.dtype), (&l.name, &l.shape, l.dtype));
        assert!(
            contents(&e, &r.buffer) == contents(&e, &l.buffer),
            "{}",
            r.name
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_gets_one_clear_error_each() {
    let server = Server::start("bad-input");
    let c = server.client();
    c.put("random.safetensors", &pattern(100_000, 3), false)
        .unwrap();
    let config = server.config();
    let open = |cfg: &S3Config, key: &str| open_objects_with(cfg, &[url(key)]);

    let mut wrong = config.clone();
    wrong.credentials = Some((common::KEY_ID.into(), "not-the-secret".into(), None));
    let e = open(&wrong, "random.safetensors").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("refused these credentials"), "{e}");

    let e = open_objects_with(&config, &["s3://no-such-bucket/k.safetensors"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string().contains("no bucket \"no-such-bucket\""),
        "{e}"
    );

    let e = open(&config, "missing.safetensors").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("no such object"), "{e}");

    let files = open(&config, "random.safetensors").unwrap();
    let e = load_safetensors_sources(&engine(), &files, Allocation::PerFile, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format, "{e}");
    assert!(e.to_string().contains("random.safetensors"), "{e}");

    let e = open_objects_with(&config, &["s3://Bad_Bucket/k"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    // Nothing listens here: the connection is refused, retried, reported.
    let mut gone = config_for("http://127.0.0.1:1");
    gone.retry.attempts = 2;
    let e = open(&gone, "random.safetensors").unwrap_err();
    assert!(e.to_string().contains("gave up after 2 attempts"), "{e}");
}

#[test]
fn throttling_and_dropped_connections_are_retried() {
    let server = Server::start("retries");
    let data = pattern(2 << 20, 4);
    server.client().put("blob.bin", &data, false).unwrap();
    let proxy = FaultProxy::start(server.port);
    let config = config_for(&proxy.endpoint());
    // The HEAD and the first GETs are throttled, and two connections
    // break in the middle of a body.
    proxy.faults.slow_down.store(3, Ordering::SeqCst);
    proxy.faults.cut_after.store(30_000, Ordering::SeqCst);
    proxy.faults.cuts.store(2, Ordering::SeqCst);
    let files = open_objects_with(&config, &[url("blob.bin")]).unwrap();
    let e = engine();
    let (bufs, _) = e.load_sources(&files, None).unwrap();
    assert!(contents(&e, &bufs[0]) == data);
    assert_eq!(proxy.faults.slow_down.load(Ordering::SeqCst), 0);
    assert_eq!(proxy.faults.cuts.load(Ordering::SeqCst), 0);
    assert!(proxy.faults.accepted.load(Ordering::SeqCst) >= 6);
}

#[test]
fn windows_are_read_from_few_requests_that_resume_where_they_broke() {
    let server = Server::start("streams");
    let data = pattern((3 << 20) + 12345, 8);
    server.client().put("blob.bin", &data, false).unwrap();
    let proxy = FaultProxy::start(server.port);
    let files = open_objects_with(&config_for(&proxy.endpoint()), &[url("blob.bin")]).unwrap();
    // Two workers, requests of at most 1 MiB over 64 KiB slots: 4 GETs
    // for 49 windows. Two connections break inside a response, each
    // resumed by one GET from the byte where it stopped.
    let config = EngineConfig {
        remote_streams: 2,
        remote_read_bytes: 1 << 20,
        ..engine().config().clone()
    };
    let e = Engine::new(Arc::new(HostDevice::new()), config).unwrap();
    proxy.faults.cut_after.store(200_000, Ordering::SeqCst);
    proxy.faults.cuts.store(2, Ordering::SeqCst);
    let (bufs, stats) = e.load_sources(&files, None).unwrap();
    assert!(contents(&e, &bufs[0]) == data);
    assert_eq!(proxy.faults.cuts.load(Ordering::SeqCst), 0);
    assert_eq!((stats.windows, stats.io_threads), (49, 2));
    assert_eq!(proxy.faults.gets.load(Ordering::SeqCst), 4 + 2);
}

#[test]
fn retries_stop_at_the_stated_limit_with_a_clear_error() {
    let server = Server::start("retry-limit");
    server.client().put("blob.bin", b"abc", false).unwrap();
    let proxy = FaultProxy::start(server.port);
    proxy.faults.slow_down.store(usize::MAX, Ordering::SeqCst);
    let mut config = config_for(&proxy.endpoint());
    config.retry = RetryPolicy {
        attempts: 3,
        ..config.retry
    };
    let started = Instant::now();
    let e = open_objects_with(&config, &[url("blob.bin")]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("gave up after 3 attempts"), "{msg}");
    assert!(msg.contains("HTTP 503"), "{msg}");
    assert_eq!(proxy.faults.accepted.load(Ordering::SeqCst), 3);
    assert!(started.elapsed() < config.retry.max_total_wait() * 20);
}

#[test]
fn an_object_replaced_during_a_load_is_an_error_not_mixed_bytes() {
    let server = Server::start("replaced");
    let c = server.client();
    c.put("blob.bin", &pattern(4 << 20, 5), false).unwrap();
    let files = open_objects_with(&server.config(), &[url("blob.bin")]).unwrap();
    // One worker, a request per window: it replaces the object after its
    // first window, before it asks for the next (with more workers, the
    // others may read every other window of the old object meanwhile, and
    // one request for the whole object reads the old one whole: both are
    // correct loads).
    let mut config = EngineConfig {
        io_threads: 1,
        remote_streams: 1,
        remote_read_bytes: 1 << 16,
        ..EngineConfig::default()
    };
    config.staging.slot_bytes = 1 << 16;
    config.staging.total_bytes = 4 << 16;
    let one_worker = Engine::new(Arc::new(HostDevice::new()), config).unwrap();
    let replaced = AtomicBool::new(false);
    let replace = |_: u64| {
        if !replaced.swap(true, Ordering::SeqCst) {
            c.put("blob.bin", &pattern(4 << 20, 6), false).unwrap();
        }
    };
    let e = one_worker.load_sources(&files, Some(&replace)).unwrap_err();
    assert!(replaced.load(Ordering::SeqCst));
    let replaced_error = "was replaced while it was being read";
    assert!(e.to_string().contains(replaced_error), "{e}");

    // Replaced between the open and the load.
    let files = open_objects_with(&server.config(), &[url("blob.bin")]).unwrap();
    c.put("blob.bin", &pattern(4 << 20, 7), false).unwrap();
    let e = engine().load_sources(&files, None).unwrap_err();
    assert!(e.to_string().contains(replaced_error), "{e}");
}

#[test]
fn conditional_creates_refuse_an_existing_object() {
    let server = Server::start("conditional");
    let c = server.client();
    let etag = c.put("commit.json", b"{}", true).unwrap();
    assert!(!etag.is_empty());
    let e = c.put("commit.json", b"{}", true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    c.delete("commit.json").unwrap();
    c.put("commit.json", b"{}", true).unwrap();
    assert_eq!(c.head("commit.json").unwrap().len, 2);
}
