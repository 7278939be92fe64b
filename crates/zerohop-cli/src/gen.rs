//! `zerohop gen`: a synthetic transformer-shaped safetensors model.

use crate::common::gib;
use std::path::Path;
use zerohop::progress_line::ProgressLine;
use zerohop::{safetensors, Result};

pub fn run(out: &Path, size: u64, seed: u64) -> Result<()> {
    let bar = ProgressLine::new("writing", size);
    let progress = |n| bar.advance(n);
    let written = safetensors::write_synthetic(out, size, seed, Some(&progress))?;
    bar.finish();
    let tensors = safetensors::transformer_shapes(size).len();
    println!(
        "wrote {} ({tensors} bf16 tensors) to {}",
        gib(written),
        out.display()
    );
    Ok(())
}
