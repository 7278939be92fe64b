//! `zerohop gen`: a synthetic transformer-shaped safetensors model.

use crate::progress::bytes_bar;
use crate::size::human_bytes;
use std::path::Path;
use zerohop::{safetensors, Result};

pub fn run(out: &Path, size: u64, seed: u64) -> Result<()> {
    let bar = bytes_bar("writing", size, false);
    let progress = |n| bar.inc(n);
    let written = safetensors::write_synthetic(out, size, seed, Some(&progress))?;
    bar.finish_and_clear();
    let tensors = safetensors::transformer_shapes(size).len();
    println!(
        "wrote {} ({tensors} bf16 tensors) to {}",
        human_bytes(written),
        out.display()
    );
    Ok(())
}
