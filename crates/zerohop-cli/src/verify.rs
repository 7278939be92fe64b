//! Comparing what a transfer placed in device memory with the files (or
//! objects) the bytes came from (`load --verify`, `checkpoint restore --against`).

use std::path::PathBuf;
use zerohop::storage::SourceFile;
use zerohop::{DeviceBuffer, Engine, Result};
use zerohop_cmd::progress::bytes_bar;

/// Destination ranges and where their bytes come from, for `--verify`.
pub(crate) struct Placed {
    pub path: PathBuf,
    pub file_offset: u64,
    pub buffer: DeviceBuffer,
}

/// Reads every placed range back from the device and compares it with the
/// file, 64 MiB at a time. Prints the first difference. `quiet`: no
/// progress bar.
pub fn compare_with_files(engine: &Engine, placed: &[Placed], quiet: bool) -> Result<bool> {
    const CHUNK: usize = 64 << 20;
    let total = placed.iter().map(|p| p.buffer.len() as u64).sum();
    let bar = bytes_bar("verifying", total, quiet);
    let mut dev = vec![0u8; CHUNK];
    let mut host = vec![0u8; CHUNK];
    let mut open: Option<(PathBuf, SourceFile)> = None;
    for p in placed {
        if open.as_ref().is_none_or(|(path, _)| *path != p.path) {
            let mut f = zerohop_names::open_sources(std::slice::from_ref(&p.path))?;
            open = Some((p.path.clone(), f.remove(0)));
        }
        let file = &open.as_ref().expect("opened above").1;
        let mut off = 0;
        while off < p.buffer.len() {
            let n = CHUNK.min(p.buffer.len() - off);
            engine.device().read_back(&p.buffer, off, &mut dev[..n])?;
            let at = p.file_offset + off as u64;
            file.read_exact_at(&mut host[..n], at)?;
            if let Some(i) = (0..n).find(|&i| dev[i] != host[i]) {
                bar.finish_and_clear();
                eprintln!(
                    "first difference: {} byte {} (device {:#04x}, file {:#04x})",
                    p.path.display(),
                    at + i as u64,
                    dev[i],
                    host[i]
                );
                return Ok(false);
            }
            off += n;
            bar.inc(n as u64);
        }
    }
    bar.finish_and_clear();
    Ok(true)
}
