//! Checkpoints in a real object store: saved as multipart uploads from the
//! staging slots and committed by the manifest, restored and verified,
//! saved incrementally (unchanged parts copied by the server), and never
//! visible when a save fails or its server dies.

mod common;

use common::{config_for, pattern, upload_engine, FaultProxy, Server, MIN};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use zerohop::device::HostDevice;
use zerohop::testing::{SimConfig, SimDevice};
use zerohop::{DeviceBuffer, Engine, ErrorKind};
use zerohop_checkpoint::{
    remove, restore, save, verify, ChecksumSite, Location, Manifest, Region, SaveOptions,
};
use zerohop_s3::checkpoint_location_with;

/// One checksum per MiB: S3's smallest parts (the slots) hold five.
const CHUNK: u64 = 1 << 20;

/// A device that hashes chunks itself (simulated), and one that cannot
/// (the host hashes them in staging).
fn engines() -> [Engine; 2] {
    let sim = SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(100),
        ..SimConfig::default()
    });
    [
        upload_engine(Arc::new(sim)),
        upload_engine(Arc::new(HostDevice::new())),
    ]
}

fn at(server: &Server, name: &str) -> Location {
    let url = format!("s3://models/ckpts/{name}");
    checkpoint_location_with(&server.config(), &url, MIN as u64).unwrap()
}

fn opts(parent: Option<Location>) -> SaveOptions {
    SaveOptions {
        parent,
        shards: Some(2),
        chunk_bytes: CHUNK,
        ..SaveOptions::default()
    }
}

/// Regions of several parts each, one of a part and a bit, one tiny.
fn regions(e: &Engine, data: &[Vec<u8>]) -> Vec<Region> {
    data.iter()
        .enumerate()
        .map(|(i, d)| Region::raw(format!("r{i}"), upload(e, d)))
        .collect()
}

fn contents() -> Vec<Vec<u8>> {
    vec![
        pattern(3 * MIN + 4321, 1),
        pattern(MIN + 77, 2),
        pattern(100, 3),
    ]
}

fn upload(e: &Engine, data: &[u8]) -> DeviceBuffer {
    let b = e.device().alloc(data.len()).unwrap();
    e.device().write_from_host(&b, 0, data).unwrap();
    b
}

fn download(e: &Engine, b: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    e.device().read_back(b, 0, &mut out).unwrap();
    out
}

/// Restores `at` and checks it holds `data`.
fn assert_holds(e: &Engine, at: &Location, data: &[Vec<u8>]) {
    let back = restore(e, at, None).unwrap();
    assert_eq!(back.buffers.len(), data.len());
    for (b, d) in back.buffers.iter().zip(data) {
        assert!(download(e, b) == *d, "{at}: restored bytes differ");
    }
}

/// On S3 a checkpoint's own objects hold every byte, those the server
/// copied from the parent included (a restore reads referenced chunks
/// from the parent, so this reads the objects themselves).
fn assert_objects_whole(at: &Location, m: &Manifest, data: &[Vec<u8>]) {
    for (entry, d) in m.entries.iter().zip(data) {
        let mut got = vec![0u8; d.len()];
        // A large entry may be split over several objects.
        for (piece, from) in entry.placement() {
            let file = at
                .store
                .open_data(&at.name, &m.files[piece.file].name)
                .unwrap();
            let into = &mut got[from as usize..(from + piece.bytes) as usize];
            file.read_exact_at(into, piece.offset).unwrap();
        }
        assert!(got == *d, "{at}: object bytes of {} differ", entry.name);
    }
}

#[test]
fn checkpoints_round_trip_through_an_object_store() {
    let server = Server::start("ckpt-round-trip");
    let data = contents();
    for (i, e) in engines().iter().enumerate() {
        let name = format!("step-{i}");
        let ck = at(&server, &name);
        let saved = save(e, &regions(e, &data), &ck, &opts(None), None).unwrap();
        let total: u64 = data.iter().map(|d| d.len() as u64).sum();
        assert_eq!(
            saved.stats.remote_bytes, total,
            "every byte went out as parts"
        );
        assert_eq!(saved.written_bytes, total);
        match (i, &saved.checksums) {
            (0, ChecksumSite::Device { .. }) | (1, ChecksumSite::Host { .. }) => {}
            (_, site) => panic!("engine {i} hashed {site}"),
        }
        assert!(ck.store.list().unwrap().contains(&name));
        let v = verify(&ck, 4, None).unwrap();
        assert_eq!(v.bytes, total);
        assert_holds(e, &ck, &data);
        // A name taken is refused, and the checkpoint stays.
        let err = save(e, &regions(e, &data), &ck, &opts(None), None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
        assert_holds(e, &ck, &data);
    }
    let e = &engines()[1];
    let err = restore(e, &at(&server, "never-saved"), None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("not a checkpoint"), "{err}");
    for name in ["step-0", "step-1"] {
        remove(&at(&server, name)).unwrap();
    }
    assert!(
        server.client().list("ckpts/").unwrap().is_empty(),
        "nothing left"
    );
}

#[test]
fn incremental_saves_reference_unchanged_chunks_and_the_server_copies_their_parts() {
    let server = Server::start("ckpt-incremental");
    for (i, e) in engines().iter().enumerate() {
        let (first, second) = (format!("full-{i}"), format!("incr-{i}"));
        let mut data = contents();
        let parent = at(&server, &first);
        save(e, &regions(e, &data), &parent, &opts(None), None).unwrap();
        // One byte changed, in the first region's second part.
        data[0][MIN + 10] ^= 0xff;
        let child = at(&server, &second);
        let saved = save(
            e,
            &regions(e, &data),
            &child,
            &opts(Some(parent.clone())),
            None,
        )
        .unwrap();
        let total: u64 = data.iter().map(|d| d.len() as u64).sum();
        assert!(
            saved.stats.skipped_bytes > 0 && saved.stats.remote_bytes < total,
            "engine {i}: unchanged parts are copied by the server, not sent: {:?}",
            saved.stats
        );
        let referenced = saved
            .manifest
            .chunks
            .iter()
            .filter(|c| c.stored_in.as_deref() == Some(first.as_str()))
            .count();
        assert!(
            referenced > 0 && referenced < saved.manifest.chunks.len(),
            "engine {i}: {referenced} chunks referenced"
        );
        verify(&child, 2, None).unwrap();
        assert_holds(e, &child, &data);
        assert_objects_whole(&child, &saved.manifest, &data);
        // The parent is needed while the child references it.
        let err = remove(&parent).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
        assert!(err.to_string().contains(&second), "{err}");
        remove(&child).unwrap();
        remove(&parent).unwrap();
    }
    assert!(server.client().list("ckpts/").unwrap().is_empty());
}

#[test]
fn a_failed_save_leaves_no_checkpoint_and_the_previous_one_loads() {
    let mut server = Server::start("ckpt-fail");
    let e = &engines()[0];
    let data = contents();
    let good = at(&server, "good");
    save(e, &regions(e, &data), &good, &opts(None), None).unwrap();

    // The server dies mid-upload: the save fails, nothing commits.
    let mut config = server.config();
    config.retry.attempts = 2;
    let url = "s3://models/ckpts/bad";
    let bad = checkpoint_location_with(&config, url, MIN as u64).unwrap();
    let pid = server.pid().to_string();
    let killed = std::sync::atomic::AtomicBool::new(false);
    let kill = |_: u64| {
        if !killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::Command::new("kill")
                .args(["-9", &pid])
                .status()
                .unwrap();
        }
    };
    let err = save(e, &regions(e, &data), &bad, &opts(None), Some(&kill)).unwrap_err();
    assert!(
        err.to_string().contains("gave up after 2 attempts"),
        "{err}"
    );
    server.kill();
    server.run();
    assert_eq!(good.store.list().unwrap(), ["good"], "no new checkpoint");
    assert_holds(e, &good, &data);
    let err = restore(e, &at(&server, "bad"), None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // Leftovers of a save that died (here, a stray object): the next save
    // under the name says so, and removing them lets it through.
    server
        .client()
        .put("ckpts/bad/data-00000.safetensors", b"stray", false)
        .unwrap();
    let bad = at(&server, "bad");
    let err = save(e, &regions(e, &data), &bad, &opts(None), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert!(err.to_string().contains("--unfinished"), "{err}");
    bad.store.remove(&bad.name).unwrap();
    save(e, &regions(e, &data), &bad, &opts(None), None).unwrap();
    assert_holds(e, &bad, &data);

    // A save refused mid-way (a parent in another prefix) writes nothing.
    let elsewhere =
        checkpoint_location_with(&server.config(), "s3://models/other/good", MIN as u64).unwrap();
    let err = save(
        e,
        &regions(e, &data),
        &at(&server, "child"),
        &opts(Some(elsewhere)),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("must be a sibling"), "{err}");
    assert_eq!(good.store.list().unwrap(), ["bad", "good"]);
}

#[test]
fn saves_and_restores_ride_out_throttling_and_dropped_connections() {
    let server = Server::start("ckpt-faults");
    let proxy = FaultProxy::start(server.port);
    let url = "s3://models/ckpts/flaky";
    let at = checkpoint_location_with(&config_for(&proxy.endpoint()), url, MIN as u64).unwrap();
    let e = &engines()[0];
    let data = contents();
    let f = &proxy.faults;
    // Throttled requests, new connections cut, then, once data flows,
    // answers cut on the pooled connections: of part uploads, of the
    // completions and of the manifest's conditional create, whose retries
    // find the work done (the object's ETag is the one the request makes).
    f.slow_down.store(2, Ordering::SeqCst);
    f.cut_after.store(100, Ordering::SeqCst);
    f.cuts.store(2, Ordering::SeqCst);
    let armed = std::sync::atomic::AtomicBool::new(false);
    let cut_later = |_: u64| {
        if !armed.swap(true, Ordering::SeqCst) {
            f.cut_answers.store(3, Ordering::SeqCst);
        }
    };
    save(e, &regions(e, &data), &at, &opts(None), Some(&cut_later)).unwrap();
    f.cut_answers.store(2, Ordering::SeqCst);
    assert_holds(e, &at, &data);
    assert_eq!(f.slow_down.load(Ordering::SeqCst), 0);
    assert_eq!(f.cuts.load(Ordering::SeqCst), 0);
    assert_eq!(f.cut_answers.load(Ordering::SeqCst), 0);
    assert_eq!(at.store.list().unwrap(), ["flaky"]);
}

#[test]
fn a_create_whose_answer_was_lost_is_recognised_by_its_etag() {
    let server = Server::start("ckpt-lost-answers");
    let proxy = FaultProxy::start(server.port);
    let client = zerohop_s3::S3Client::new(&config_for(&proxy.endpoint()), "models").unwrap();
    let f = &proxy.faults;
    // A conditional create done, its answer cut: the retry is refused
    // (the object exists), and the object is found to be this one.
    client.put("warm-up", b"x", false).unwrap();
    f.cut_answers.store(1, Ordering::SeqCst);
    client.put("manifest.json", b"ours", true).unwrap();
    assert_eq!(f.cut_answers.load(Ordering::SeqCst), 0);
    // Another's object under the name is still refused.
    let err = client.put("manifest.json", b"theirs", true).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    // A completion done, its answer cut: the same.
    let upload = zerohop_s3::MultipartUpload::start(Arc::new(client), "big").unwrap();
    upload.upload_part(1, &pattern(MIN, 9)).unwrap();
    upload.upload_part(2, &pattern(100, 9)).unwrap();
    f.cut_answers.store(1, Ordering::SeqCst);
    upload.complete(true).unwrap();
    assert_eq!(f.cut_answers.load(Ordering::SeqCst), 0);
    assert_eq!(server.client().head("big").unwrap().len, MIN as u64 + 100);
}
