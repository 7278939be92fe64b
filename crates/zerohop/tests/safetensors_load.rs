//! safetensors shards through the engine on the simulated device, and the
//! malformed files a loader meets in the wild.

mod common;

use common::{write, TestDir};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use zerohop::safetensors::{
    load_safetensors, serialize_header, write_synthetic, Allocation, Dtype, TensorInfo,
};
use zerohop::testing::{SimConfig, SimDevice};
use zerohop::{Device, Engine, EngineConfig, ErrorKind, HotRoute};

fn engine(hot: HotRoute) -> Engine {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: std::time::Duration::from_micros(20),
        ..Default::default()
    }));
    let mut c = EngineConfig {
        hot_route: hot,
        dma_window_bytes: 1 << 20,
        ..EngineConfig::default()
    };
    c.staging.total_bytes = 4 << 20;
    c.staging.slot_bytes = 1 << 20;
    Engine::new(dev, c).unwrap()
}

/// Every tensor's device bytes equal its bytes in the file.
fn assert_matches_file(
    engine: &Engine,
    paths: &[std::path::PathBuf],
    model: &zerohop::safetensors::LoadedModel,
) {
    for t in &model.tensors {
        let mut dev = vec![0u8; t.buffer.len()];
        engine.device().read_back(&t.buffer, 0, &mut dev).unwrap();
        let mut file = vec![0u8; t.buffer.len()];
        std::fs::File::open(&paths[t.file])
            .unwrap()
            .read_exact_at(&mut file, t.file_offset)
            .unwrap();
        assert!(dev == file, "tensor {} differs", t.name);
        assert_eq!(t.dtype.byte_len(&t.shape).unwrap(), t.buffer.len() as u64);
    }
}

#[test]
fn synthetic_shards_load_per_file_and_per_tensor() {
    let dir = TestDir::new("st");
    let paths: Vec<_> = (0..2)
        .map(|i| {
            let p = dir.path(&format!("model-{i}.safetensors"));
            write_synthetic(&p, 3 << 20, i, None).unwrap();
            p
        })
        .collect();
    // Shards of the same shape share tensor names: load one pair of distinct files.
    let e =
        load_safetensors(&engine(HotRoute::Staged), &paths, Allocation::PerFile, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format);
    assert!(e.to_string().contains("more than one shard"), "{e}");
    for hot in [HotRoute::Staged, HotRoute::PageCacheDma] {
        for alloc in [Allocation::PerFile, Allocation::PerTensor] {
            let engine = engine(hot);
            let model = load_safetensors(&engine, &paths[..1], alloc, None).unwrap();
            assert!(model.tensors.len() > 10);
            assert_eq!(model.metadata[0]["format"], "pt");
            assert_matches_file(&engine, &paths[..1], &model);
        }
    }
}

fn handmade(path: &std::path::Path, tensors: &[(&str, Dtype, Vec<u64>)]) -> Vec<u8> {
    let mut begin = 0;
    let infos: Vec<TensorInfo> = tensors
        .iter()
        .map(|(n, d, s)| {
            let len = d.byte_len(s).unwrap();
            let t = TensorInfo {
                name: n.to_string(),
                dtype: *d,
                shape: s.clone(),
                begin,
                end: begin + len,
            };
            begin += len;
            t
        })
        .collect();
    let mut bytes = serialize_header(&infos, &BTreeMap::new(), 8);
    bytes.extend(common::pattern(begin as usize, 11));
    std::fs::write(path, &bytes).unwrap();
    bytes
}

#[test]
fn odd_dtypes_zero_size_and_multiple_shards() {
    let dir = TestDir::new("st-odd");
    let a = dir.path("a.safetensors");
    let b = dir.path("b.safetensors");
    handmade(
        &a,
        &[
            ("f8", Dtype::F8_E4M3, vec![7, 3]),
            ("empty", Dtype::BF16, vec![0, 5]),
            ("odd", Dtype::F32, vec![13]),
            ("fp4", Dtype::F4, vec![3, 6]),
            ("scales", Dtype::F8_E8M0, vec![5]),
        ],
    );
    handmade(
        &b,
        &[
            ("scalar", Dtype::I64, vec![]),
            ("bool", Dtype::BOOL, vec![3]),
        ],
    );
    let engine = engine(HotRoute::Auto);
    let paths = vec![a, b];
    let model = load_safetensors(&engine, &paths, Allocation::PerTensor, None).unwrap();
    assert_eq!(model.tensors.len(), 7);
    // Two F4 elements to a byte.
    assert_eq!(model.get("fp4").unwrap().buffer.len(), 9);
    assert_eq!(model.get("empty").unwrap().buffer.len(), 0);
    assert_eq!(model.get("scalar").unwrap().buffer.len(), 8);
    assert_matches_file(&engine, &paths, &model);
}

#[test]
fn malformed_files_are_format_errors() {
    let dir = TestDir::new("st-bad");
    let good = dir.path("good.safetensors");
    let bytes = handmade(&good, &[("w", Dtype::F32, vec![64])]);
    let engine = engine(HotRoute::Auto);
    let load = |name: &str, data: &[u8]| {
        let p = write(&dir.path(name), data);
        load_safetensors(&engine, &[p], Allocation::PerFile, None).unwrap_err()
    };
    let e = load("truncated.safetensors", &bytes[..bytes.len() - 10]);
    assert_eq!(e.kind(), ErrorKind::Format);
    assert!(e.to_string().contains("truncated.safetensors"), "{e}");
    let e = load("garbage.safetensors", b"\x10\0\0\0\0\0\0\0this is not json");
    assert!(e.to_string().contains("not a JSON object"), "{e}");
    let e = load("short.safetensors", b"abc");
    assert!(e.to_string().contains("shorter than"), "{e}");
    let e = load("hugeheader.safetensors", &[0xff; 16]);
    assert!(e.to_string().contains("exceeds"), "{e}");
    let json = br#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
    let mut overlap = (json.len() as u64).to_le_bytes().to_vec();
    overlap.extend_from_slice(json);
    overlap.extend_from_slice(&[0; 12]);
    let e = load("overlap.safetensors", &overlap);
    assert!(e.to_string().contains("overlap"), "{e}");
    let json = br#"{"a":{"dtype":"U8","shape":[64],"data_offsets":[0,64]}}"#;
    let mut past = (json.len() as u64).to_le_bytes().to_vec();
    past.extend_from_slice(json);
    past.extend_from_slice(&[0; 10]);
    let e = load("past.safetensors", &past);
    assert!(e.to_string().contains("past the end"), "{e}");
}
