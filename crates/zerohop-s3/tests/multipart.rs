//! Multipart uploads against a real server: parts sent from several
//! threads in any order make one object; an aborted upload, or one whose
//! server was killed midway, leaves no object; conditional completes
//! refuse an existing key.

mod common;

use common::{pattern, Server, MIN};
use std::sync::Arc;
use zerohop::ErrorKind;
use zerohop_s3::MultipartUpload;

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
