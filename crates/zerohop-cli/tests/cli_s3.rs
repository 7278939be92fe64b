//! `zerohop checkpoint` against a real S3-compatible server (s3s-fs, as
//! the object store tests start it), configured through the AWS_*
//! variables as a user would.

mod common;
#[path = "../../zerohop-s3/tests/common/mod.rs"]
mod s3;

use s3::{Server, KEY_ID, SECRET};
use std::path::Path;
use std::process::{Command, Output};

fn zerohop(server: &Server, args: &[&str]) -> Output {
    let nowhere = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-aws-files");
    Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(args)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_CONFIG_FILE", &nowhere)
        .env("AWS_SHARED_CREDENTIALS_FILE", &nowhere)
        .output()
        .expect("zerohop runs")
}

/// Runs and succeeds; its standard output.
fn ok(server: &Server, args: &[&str]) -> String {
    let out = zerohop(server, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails with a clear error naming `needle`, without panicking.
fn fails_with(server: &Server, args: &[&str], needle: &str) {
    common::assert_clear_failure(&zerohop(server, args), args, needle);
}

#[test]
fn checkpoints_save_list_verify_restore_and_remove_in_an_object_store() {
    let server = Server::start("cli-ckpt");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-s3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.safetensors");
    let m = model.to_str().unwrap();
    ok(&server, &["gen", "--size", "24MiB", m]);
    let host = ["--device", "host"];
    let save = |name: &str, extra: &[&str]| {
        let at = format!("s3://models/ck/{name}");
        // One data file: parts without its header can be copied.
        let args: Vec<&str> = ["checkpoint", "save", "--from", m, &at, "--shards", "1"]
            .into_iter()
            .chain(host)
            .chain(extra.iter().copied())
            .collect();
        ok(&server, &args)
    };
    let first = save("a", &[]);
    assert!(first.contains("s3://models/ck/a"), "{first}");
    // The same tensors against a parent: every part but those holding a
    // header is copied by the server.
    let second = save("b", &["--parent", "s3://models/ck/a"]);
    assert!(second.contains("unchanged"), "{second}");
    assert!(second.contains("the server copied those parts"), "{second}");

    let listed = ok(&server, &["checkpoint", "ls", "s3://models/ck/"]);
    assert!(listed.contains("2 checkpoints"), "{listed}");
    assert!(
        listed
            .lines()
            .any(|l| l.contains(" b ") && l.ends_with(" a")),
        "{listed}"
    );
    let entries = ok(&server, &["checkpoint", "ls", "s3://models/ck/b"]);
    assert!(
        entries.contains("chunks are stored in parent checkpoints"),
        "{entries}"
    );
    let verified = ok(&server, &["checkpoint", "verify", "s3://models/ck/b"]);
    assert!(verified.starts_with("ok: "), "{verified}");
    let restored = ok(
        &server,
        &[
            "checkpoint",
            "restore",
            "s3://models/ck/b",
            "--against",
            m,
            "--device",
            "host",
        ],
    );
    assert!(restored.contains("contents match the files"), "{restored}");

    fails_with(
        &server,
        &["checkpoint", "rm", "s3://models/ck/a"],
        "still needed by checkpoint(s) b",
    );
    fails_with(
        &server,
        &[
            "checkpoint",
            "save",
            "--from",
            m,
            "s3://models/ck/a",
            "--device",
            "host",
        ],
        "already exists",
    );
    fails_with(
        &server,
        &[
            "checkpoint",
            "restore",
            "s3://models/ck/none",
            "--device",
            "host",
        ],
        "not a checkpoint",
    );
    fails_with(
        &server,
        &["checkpoint", "rm", "--unfinished", "s3://models/ck/b"],
        "is a committed checkpoint",
    );
    ok(&server, &["checkpoint", "rm", "s3://models/ck/b"]);
    ok(&server, &["checkpoint", "rm", "s3://models/ck/a"]);
    assert!(
        server.client().list("ck/").unwrap().is_empty(),
        "nothing left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
