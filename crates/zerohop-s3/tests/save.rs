//! The engine writing objects to a real server: device memory goes out as
//! a multipart upload whose parts are the staging slots; the object
//! appears whole once the write returns, and a write the server dies under
//! leaves no new object (the previous one stays).

mod common;

use common::{pattern, upload_engine, Server, MIN};
use std::sync::Arc;
use zerohop::device::HostDevice;
use zerohop::plan::TransferPlan;
use zerohop::{DeviceBuffer, Engine, ErrorKind};
use zerohop_s3::{create_object, S3Url};

fn engine() -> Engine {
    upload_engine(Arc::new(HostDevice::new()))
}

fn upload(e: &Engine, data: &[u8]) -> DeviceBuffer {
    let b = e.device().alloc(data.len()).unwrap();
    e.device().write_from_host(&b, 0, data).unwrap();
    b
}

fn read_all(server: &Server, key: &str) -> Vec<u8> {
    let c = server.client();
    let info = c.head(key).unwrap();
    let mut buf = vec![0u8; info.len as usize];
    c.read_range(key, &info.etag, info.len, 0, &mut buf)
        .unwrap();
    buf
}

#[test]
fn device_memory_becomes_an_object_of_whole_parts() {
    let server = Server::start("save");
    let client = Arc::new(server.client());
    let e = engine();
    let len = (2 * MIN + 12345) as u64;
    let url = S3Url::parse("s3://models/ckpt/data-00000.safetensors").unwrap();
    let files = vec![create_object(client, &url, len, MIN as u64, true, None).unwrap()];
    let src = pattern(2 * MIN, 8);
    let buf = upload(&e, &src);
    let header = b"a header of host bytes".to_vec();
    let mut expect = vec![0u8; len as usize];
    expect[..header.len()].copy_from_slice(&header);
    let mut plan = TransferPlan::new();
    let (at, n) = (4096u64, 2 * MIN as u64);
    plan.add(&files, 0, at, n, &buf, 0).unwrap();
    expect[at as usize..(at + n) as usize].copy_from_slice(&src);
    e.write_host_bytes(&files[0], 0, &header).unwrap();
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert_eq!(stats.remote_bytes, n);
    assert!(read_all(&server, &url.key) == expect);
    // `only_if_new`: a second object at the same key is refused, whole.
    let again =
        vec![create_object(Arc::new(server.client()), &url, len, MIN as u64, true, None).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&again, 0, 0, 100, &buf, 0).unwrap();
    let err = e.write(&again, &plan, None, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert!(
        read_all(&server, &url.key) == expect,
        "the first object stays"
    );
}

#[test]
fn a_server_killed_during_a_write_leaves_the_previous_object() {
    let mut server = Server::start("save-kill");
    let old = pattern(5000, 1);
    server.client().put("data.bin", &old, false).unwrap();
    let e = engine();
    let len = (4 * MIN) as u64;
    let url = S3Url::parse("s3://models/data.bin").unwrap();
    let mut config = server.config();
    config.retry.attempts = 2;
    let client = Arc::new(zerohop_s3::S3Client::new(&config, "models").unwrap());
    let files = vec![create_object(client, &url, len, MIN as u64, false, None).unwrap()];
    let buf = upload(&e, &pattern(len as usize, 2));
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, len, &buf, 0).unwrap();
    let killed = std::sync::atomic::AtomicBool::new(false);
    let kill = |_: u64| {
        if !killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // Other workers' parts may still be on their way: they fail.
            std::process::Command::new("kill")
                .args(["-9", &server_pid(&server)])
                .status()
                .unwrap();
        }
    };
    let err = e.write(&files, &plan, None, Some(&kill)).unwrap_err();
    assert!(
        err.to_string().contains("gave up after 2 attempts"),
        "{err}"
    );
    drop(files); // its upload is aborted (no server: nothing to see either way)
    server.kill();
    server.run();
    assert!(
        read_all(&server, "data.bin") == old,
        "the previous object is whole"
    );

    // Parts smaller than S3 allows are refused before anything is sent.
    let client = Arc::new(server.client());
    let e = create_object(client, &url, len, 1 << 20, false, None).unwrap_err();
    assert!(e.to_string().contains("at least"), "{e}");
}

fn server_pid(server: &Server) -> String {
    server.pid().to_string()
}
