//! `zerohop gen`: a synthetic transformer-shaped safetensors model, in one
//! file or in shards; dense or of many small tensors; bf16 or fp8.

mod layout;

use crate::progress::bytes_bar;
use crate::size::human_bytes;
use clap::Args;
use layout::{GenDtype, Planned};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use zerohop::safetensors::{fill_random, serialize_header, Dtype, TensorInfo};
use zerohop::{Error, Result};

#[derive(Args, Debug)]
pub struct GenArgs {
    /// Approximate size: 8GiB, 512MiB, 1G (K, M, G, T and KiB ... TiB are
    /// powers of 1024; KB, MB, GB, TB powers of 1000); not 0.
    #[arg(long, value_parser = crate::size::parse_length)]
    pub size: u64,
    /// Seed of the random values: the same seed and options give the same files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Split the model into N files of about SIZE/N each, named as
    /// Hugging Face names shards, next to OUT: OUT=dir/model.safetensors
    /// gives dir/model-00001-of-0000N.safetensors ... and
    /// dir/model.safetensors.index.json (OUT itself is not written).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Many small tensors: an MoE-style model whose every tensor is 1 - 4 MiB
    /// (8GiB gives ~3,300 tensors), instead of a dense transformer.
    #[arg(long)]
    pub small_tensors: bool,
    /// Type of the layers' weight matrices: bf16, or fp8 (F8_E4M3, each
    /// followed by an F32 `..._scale` tensor; embeddings, norms and lm_head
    /// stay bf16).
    #[arg(long, value_enum, default_value_t = GenDtype::Bf16)]
    pub dtype: GenDtype,
    /// Replace files that exist already (without it, an existing file is
    /// an error and nothing is written).
    #[arg(long)]
    pub force: bool,
    /// The safetensors file to write (with --shards, where the shards go).
    pub out: PathBuf,
}

impl GenArgs {
    /// The default model: one bf16 file of about `size` bytes, seed 1.
    pub fn model(out: &Path, size: u64) -> Self {
        GenArgs {
            size,
            seed: 1,
            shards: 1,
            small_tensors: false,
            dtype: GenDtype::Bf16,
            force: false,
            out: out.to_path_buf(),
        }
    }
}

/// One file to write: where, and its tensors.
struct Shard {
    path: PathBuf,
    tensors: Vec<Planned>,
}

pub fn run(a: &GenArgs) -> Result<()> {
    let tensors = layout::plan(a.size, a.dtype, a.small_tensors);
    let shards = shard_files(&a.out, tensors, a.shards)?;
    if !a.force {
        let index = (shards.len() > 1).then(|| index_path(&a.out));
        let targets = shards.iter().map(|s| s.path.clone()).chain(index);
        if let Some(there) = targets.into_iter().find(|p| p.symlink_metadata().is_ok()) {
            return Err(zerohop::Error::invalid(format!(
                "{} exists: remove it or pass --force to replace it (nothing was written)",
                there.display()
            )));
        }
    }
    let total: u64 = shards
        .iter()
        .flat_map(|s| &s.tensors)
        .map(Planned::bytes)
        .sum();
    let bar = bytes_bar("writing", total, false);
    let progress = |n| bar.inc(n);
    let mut rng = seed_state(a.seed);
    let mut written = 0;
    for s in &shards {
        written += write_file(&s.path, &s.tensors, &mut rng, &progress)?;
    }
    if shards.len() > 1 {
        write_index(&a.out, &shards, total)?;
    }
    bar.finish_and_clear();
    println!(
        "wrote {} ({}) to {}",
        human_bytes(written),
        describe(shards.iter().flat_map(|s| &s.tensors)),
        match shards.as_slice() {
            [one] => one.path.display().to_string(),
            [first, .., last] => format!(
                "{} files, {} ... {}",
                shards.len(),
                first.path.display(),
                last.path.display()
            ),
            [] => unreachable!("split makes at least one shard"),
        }
    );
    Ok(())
}

/// The random stream of seed `seed`, as `write_synthetic` starts it.
fn seed_state(seed: u64) -> u64 {
    seed ^ 0x5851_F42D_4C95_7F2D
}

/// `174 bf16 tensors`, or `322 tensors: 111 BF16, 259 F8_E4M3, ...`.
fn describe<'a>(tensors: impl Iterator<Item = &'a Planned>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in tensors {
        *counts.entry(t.dtype.name()).or_default() += 1;
    }
    let n: usize = counts.values().sum();
    match counts.len() {
        1 if counts.contains_key("BF16") => format!("{n} bf16 tensors"),
        _ => {
            let each: Vec<_> = counts.iter().map(|(d, c)| format!("{c} {d}")).collect();
            format!("{n} tensors: {}", each.join(", "))
        }
    }
}

/// The files to write: OUT alone, or `shards` files named after it.
fn shard_files(out: &Path, tensors: Vec<Planned>, shards: usize) -> Result<Vec<Shard>> {
    let groups = layout::split(tensors, shards).map_err(Error::invalid)?;
    if shards == 1 {
        let tensors = groups.into_iter().next().expect("one group");
        return Ok(vec![Shard {
            path: out.to_path_buf(),
            tensors,
        }]);
    }
    Ok(groups
        .into_iter()
        .enumerate()
        .map(|(i, tensors)| Shard {
            path: shard_path(out, i + 1, shards),
            tensors,
        })
        .collect())
}

/// dir/model.safetensors, 2 of 4 -> dir/model-00002-of-00004.safetensors.
fn shard_path(out: &Path, k: usize, n: usize) -> PathBuf {
    let name = out
        .file_name()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default();
    let stem = name.strip_suffix(".safetensors").unwrap_or(&name);
    out.with_file_name(format!("{stem}-{k:05}-of-{n:05}.safetensors"))
}

/// `OUT.index.json`: which shard holds each tensor, as Hugging Face writes it.
/// Where a sharded model's index goes: OUT.index.json.
fn index_path(out: &Path) -> PathBuf {
    let mut path = out.as_os_str().to_owned();
    path.push(".index.json");
    PathBuf::from(path)
}

fn write_index(out: &Path, shards: &[Shard], total: u64) -> Result<()> {
    let mut map = serde_json::Map::new();
    for s in shards {
        let file = s.path.file_name().expect("a file name").to_string_lossy();
        for t in &s.tensors {
            map.insert(t.name.clone(), file.as_ref().into());
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": map });
    let path = index_path(out);
    let text = serde_json::to_string_pretty(&index).expect("JSON serializes");
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, "cannot write", e))
}

/// Writes one safetensors file of `tensors`, their values drawn from `rng`
/// (bf16-stream values for non-fp8 tensors, as `write_synthetic` draws
/// them). Returns the file size.
fn write_file(
    path: &Path,
    tensors: &[Planned],
    rng: &mut u64,
    progress: &dyn Fn(u64),
) -> Result<u64> {
    let mut begin = 0;
    let infos: Vec<TensorInfo> = tensors
        .iter()
        .map(|t| {
            let end = begin + t.bytes();
            let info = TensorInfo {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                begin,
                end,
            };
            begin = end;
            info
        })
        .collect();
    let meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("generator".to_string(), "zerohop gen".to_string()),
    ]);
    let header = serialize_header(&infos, &meta, 8);
    let io = |e| Error::io(path, "cannot write", e);
    let file = std::fs::File::create(path).map_err(io)?;
    // The whole file allocated up front, where the file system can: gens
    // writing side by side (bench/peers.py's cold copies) then get files
    // in one piece each, not interleaved extents that read slower.
    let _ = rustix::fs::fallocate(
        &file,
        rustix::fs::FallocateFlags::empty(),
        0,
        header.len() as u64 + begin,
    );
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    out.write_all(&header).map_err(io)?;
    let mut chunk = vec![0u8; 4 << 20];
    let mut at = 0u64;
    while at < begin {
        let n = (begin - at).min(chunk.len() as u64) as usize;
        fill(&mut chunk[..n], at, &infos, rng);
        out.write_all(&chunk[..n]).map_err(io)?;
        at += n as u64;
        progress(n as u64);
    }
    out.flush().map_err(io)?;
    Ok(header.len() as u64 + begin)
}

/// Fills the data bytes `at .. at + buf.len()` with random values, each
/// run of tensors of one kind (8-bit float or not) in one call, so a
/// model of one kind draws exactly the stream `write_synthetic` draws.
fn fill(buf: &mut [u8], at: u64, tensors: &[TensorInfo], rng: &mut u64) {
    let kind = |d: Dtype| d.bits() == 8 && d.name().starts_with("F8");
    let end = at + buf.len() as u64;
    let first = tensors.partition_point(|t| t.end <= at);
    let (mut from, mut run) = (at, None);
    for t in tensors[first..].iter().take_while(|t| t.begin < end) {
        let k = kind(t.dtype);
        if run.is_some_and(|r| r != k) {
            let dtype = if run == Some(true) {
                Dtype::F8_E4M3
            } else {
                Dtype::BF16
            };
            fill_random(
                dtype,
                &mut buf[(from - at) as usize..(t.begin - at) as usize],
                rng,
            );
            from = t.begin;
        }
        run = Some(k);
    }
    let dtype = if run == Some(true) {
        Dtype::F8_E4M3
    } else {
        Dtype::BF16
    };
    fill_random(dtype, &mut buf[(from - at) as usize..], rng);
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerohop::safetensors::{read_header, write_synthetic};
    use zerohop::storage::SourceFile;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zerohop-gen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn args(out: &Path, size: u64) -> GenArgs {
        GenArgs {
            seed: 5,
            force: true,
            ..GenArgs::model(out, size)
        }
    }

    fn header(path: &Path) -> zerohop::safetensors::Header {
        read_header(&SourceFile::open(path).unwrap()).unwrap()
    }

    #[test]
    fn the_default_is_byte_identical_to_write_synthetic() {
        let d = dir("default");
        for size in [3 << 20, 9 << 20] {
            let (ours, theirs) = (d.join("ours.safetensors"), d.join("theirs.safetensors"));
            run(&args(&ours, size)).unwrap();
            write_synthetic(&theirs, size, 5, None).unwrap();
            assert!(
                std::fs::read(&ours).unwrap() == std::fs::read(&theirs).unwrap(),
                "{size}"
            );
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn shards_parse_and_hold_every_tensor_once() {
        let d = dir("shards");
        let out = d.join("model.safetensors");
        run(&GenArgs {
            shards: 3,
            dtype: GenDtype::Fp8,
            ..args(&out, 24 << 20)
        })
        .unwrap();
        assert!(!out.exists());
        let planned = layout::plan(24 << 20, GenDtype::Fp8, false);
        let mut names = Vec::new();
        for k in 1..=3 {
            let path = d.join(format!("model-{k:05}-of-00003.safetensors"));
            let h = header(&path);
            assert_eq!(
                h.data_start + h.data_len,
                std::fs::metadata(&path).unwrap().len()
            );
            names.extend(h.tensors.iter().map(|t| (t.name.clone(), t.dtype)));
        }
        let want: Vec<_> = planned.iter().map(|t| (t.name.clone(), t.dtype)).collect();
        assert_eq!(names, want);
        assert!(names.iter().any(|(_, d)| *d == Dtype::F8_E4M3));
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("model.safetensors.index.json")).unwrap())
                .unwrap();
        assert_eq!(
            index["weight_map"].as_object().unwrap().len(),
            planned.len()
        );
        assert_eq!(
            index["weight_map"]["lm_head.weight"],
            "model-00003-of-00003.safetensors"
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn small_tensors_file_parses_with_every_tensor_1_to_4_mib() {
        let d = dir("small");
        let out = d.join("small.safetensors");
        run(&GenArgs {
            small_tensors: true,
            ..args(&out, 300 << 20)
        })
        .unwrap();
        let h = header(&out);
        assert!(h.tensors.len() >= 100, "{}", h.tensors.len());
        assert!(h.tensors.iter().all(|t| t.dtype == Dtype::BF16));
        assert!(h
            .tensors
            .iter()
            .all(|t| ((1 << 20)..=(4 << 20)).contains(&(t.end - t.begin))));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn fp8_bytes_are_finite_and_the_rest_is_bf16_data() {
        let d = dir("fp8");
        let out = d.join("fp8.safetensors");
        run(&GenArgs {
            dtype: GenDtype::Fp8,
            ..args(&out, 6 << 20)
        })
        .unwrap();
        let h = header(&out);
        let bytes = std::fs::read(&out).unwrap();
        let data = &bytes[h.data_start as usize..];
        let fp8 = h
            .tensors
            .iter()
            .find(|t| t.dtype == Dtype::F8_E4M3)
            .unwrap();
        let values = &data[fp8.begin as usize..fp8.end as usize];
        assert!(values.iter().all(|b| b & 0x40 == 0));
        let scale = h.tensors.iter().find(|t| t.dtype == Dtype::F32).unwrap();
        let s = f32::from_le_bytes(
            data[scale.begin as usize..scale.end as usize]
                .try_into()
                .unwrap(),
        );
        assert!(s.is_finite());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn shard_names_follow_the_output_name() {
        let p = shard_path(Path::new("/d/model.safetensors"), 2, 4);
        assert_eq!(p, Path::new("/d/model-00002-of-00004.safetensors"));
        let p = shard_path(Path::new("/d/weights"), 10, 12);
        assert_eq!(p, Path::new("/d/weights-00010-of-00012.safetensors"));
    }
}
