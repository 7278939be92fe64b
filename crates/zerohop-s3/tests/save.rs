//! Writing objects to a real server. Multipart uploads: parts sent from
//! several threads in any order make one object; an aborted upload, or one
//! whose server was killed midway, leaves no object; conditional completes
//! refuse an existing key. The engine: device memory goes out as a
//! multipart upload whose parts are the staging slots; the object appears
//! whole once the write returns, and a write the server dies under leaves
//! no new object (the previous one stays).

mod common;

use common::{pattern, upload_engine, Server, MIN};
use std::sync::Arc;
use zerohop::device::HostDevice;
use zerohop::plan::TransferPlan;
use zerohop::{DeviceBuffer, Engine, ErrorKind};
use zerohop_s3::{create_object, MultipartUpload, S3Url};

fn engine() -> Engine {
    upload_engine(Arc::new(HostDevice::new()))
}

fn upload(e: &Engine, data: &[u8]) -> DeviceBuffer {
    let b = e.device().alloc(data.len()).unwrap();
    e.device().write_from_host(&b, 0, data).unwrap();
    b
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

/// The whole object `key`, read back in one ranged GET.
fn read_all(server: &Server, key: &str) -> Vec<u8> {
    let c = server.client();
    let info = c.head(key).unwrap();
    let mut buf = vec![0u8; info.len as usize];
    let n = c
        .read_range(key, &info.etag, info.len, 0, &mut buf)
        .unwrap();
    assert_eq!(n, buf.len());
    buf
}

#[test]
fn parts_from_several_threads_make_one_object() {
    let server = Server::start("multipart");
    let data = pattern(2 * MIN + 1234, 9);
    let parts: Vec<&[u8]> = data.chunks(MIN).collect();
    let upload = MultipartUpload::start(Arc::new(server.client()), "ckpt/data.bin").unwrap();
    std::thread::scope(|s| {
        for (i, part) in parts.iter().enumerate().rev() {
            let upload = &upload;
            s.spawn(move || upload.upload_part(i as u16 + 1, part).unwrap());
        }
    });
    assert_eq!(
        server.client().head("ckpt/data.bin").unwrap_err().kind(),
        ErrorKind::NotFound,
        "nothing is visible before the upload completes"
    );
    upload.complete(false).unwrap();
    assert!(read_all(&server, "ckpt/data.bin") == data);
}

#[test]
fn aborted_and_dropped_uploads_leave_no_object() {
    let server = Server::start("multipart-abort");
    let client = Arc::new(server.client());
    let upload = MultipartUpload::start(client.clone(), "a.bin").unwrap();
    upload.upload_part(1, &pattern(MIN, 1)).unwrap();
    upload.abort().unwrap();
    let dropped = MultipartUpload::start(client.clone(), "b.bin").unwrap();
    dropped.upload_part(1, &pattern(1000, 2)).unwrap();
    drop(dropped);
    for key in ["a.bin", "b.bin"] {
        assert_eq!(
            client.head(key).unwrap_err().kind(),
            ErrorKind::NotFound,
            "{key}"
        );
    }
    // A gap in the parts is refused before anything is sent.
    let gap = MultipartUpload::start(client.clone(), "c.bin").unwrap();
    gap.upload_part(2, b"late").unwrap();
    let e = gap.complete(false).unwrap_err();
    assert!(e.to_string().contains("part 1 was never uploaded"), "{e}");
    assert_eq!(
        client.head("c.bin").unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn a_server_killed_mid_upload_leaves_the_previous_object() {
    let mut server = Server::start("multipart-kill");
    let old = pattern(3000, 3);
    server.client().put("model.bin", &old, false).unwrap();
    let upload = MultipartUpload::start(Arc::new(server.client()), "model.bin").unwrap();
    upload.upload_part(1, &pattern(MIN, 4)).unwrap();
    server.kill();
    let e = upload.upload_part(2, b"tail").unwrap_err();
    assert!(e.to_string().contains("gave up after"), "{e}");
    drop(upload); // its abort finds no server either: nothing to see
    server.run();
    assert!(
        read_all(&server, "model.bin") == old,
        "the previous object is intact"
    );
}

#[test]
fn a_conditional_complete_refuses_an_existing_key() {
    let server = Server::start("multipart-conditional");
    let client = Arc::new(server.client());
    client.put("commit.json", b"first", false).unwrap();
    let upload = MultipartUpload::start(client.clone(), "commit.json").unwrap();
    upload.upload_part(1, b"second").unwrap();
    let e = upload.complete(true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert!(read_all(&server, "commit.json") == b"first");
}
