//! `zerohop demo`: generate a model, load it, checkpoint it and restore it,
//! in a working directory of its own that is removed at the end (on an
//! error too) unless `--keep` is given.

use crate::checkpoint;
use crate::common::EngineArgs;
use crate::load::{self, LoadArgs};
use crate::size::{human_bytes, ByteSize};
use clap::Args;
use std::path::{Path, PathBuf};
use zerohop::{Error, Result};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the demo model (the checkpoint takes as much again).
    #[arg(long, default_value_t = ByteSize(1 << 30))]
    size: ByteSize,
    /// Where to make the demo's working directory (default: the system
    /// temp directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the model and the checkpoint afterwards, and say where.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: &DemoArgs) -> Result<()> {
    let parent = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = WorkDir::create(&parent, a.keep)?;
    println!(
        "== working in {} ({})",
        work.path.display(),
        if a.keep {
            "kept afterwards"
        } else {
            "removed at the end; --keep keeps it"
        }
    );
    let result = steps(a, &work.path);
    work.close();
    result
}

fn steps(a: &DemoArgs, dir: &Path) -> Result<()> {
    let model = dir.join("demo.safetensors");
    // One device for every step, so a note about it is printed once; opened
    // first, so a bad --device fails before a model is written.
    let engine = a.engine.engine()?;
    println!(
        "== generating a {} transformer-shaped model",
        human_bytes(a.size.0)
    );
    crate::gen::run(&crate::gen::GenArgs::model(&model, a.size.0))?;
    println!("== loading it with verification");
    let args = LoadArgs {
        files: vec![model.clone()],
        engine: a.engine.clone(),
        raw: false,
        per_tensor: false,
        verify: true,
        json: false,
    };
    load::run_on(&engine, &args)?;
    println!("== saving it as a checkpoint, then restoring that and comparing with the model");
    let ck = dir.join("demo-checkpoint");
    checkpoint::save(
        &engine,
        std::slice::from_ref(&model),
        &ck,
        None,
        None,
        false,
    )?;
    checkpoint::restore(&engine, &ck, &[model], false)
}

/// The demo's own directory, made anew (never one that existed) so that
/// removing it removes only what the demo wrote. `close` removes it
/// (unless kept) and says what became of it; dropping it unclosed (an
/// unwinding panic) removes it quietly.
struct WorkDir {
    path: PathBuf,
    keep: bool,
    closed: bool,
}

impl WorkDir {
    fn create(parent: &Path, keep: bool) -> Result<Self> {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, "cannot create", e))?;
        let path = parent.join(format!("zerohop-demo-{}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| Error::io(&path, "cannot create", e))?;
        Ok(WorkDir {
            path,
            keep,
            closed: false,
        })
    }

    fn close(mut self) {
        self.closed = true;
        let path = self.path.display();
        if self.keep {
            println!("== kept the demo model and its checkpoint in {path}");
            return;
        }
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => println!("== removed {path}"),
            Err(e) => eprintln!("warning: cannot remove the demo's files in {path}: {e}"),
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.closed && !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
