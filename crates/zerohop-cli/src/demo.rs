//! `zerohop demo`: generate a model, load it, checkpoint it and restore it.

use crate::checkpoint::{self, CheckpointCommand};
use crate::common::{gib, BackendArg, DirectArg, EngineArgs, HotArg};
use crate::load::{self, LoadArgs};
use std::path::PathBuf;
use zerohop::{Error, Result};

pub fn run(size: u64, dir: Option<PathBuf>) -> Result<()> {
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("zerohop-demo"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create", e))?;
    let path = dir.join("demo.safetensors");
    println!("== generating a {} transformer-shaped model", gib(size));
    crate::gen::run(&path, size, 1)?;
    println!("== loading it with verification");
    let args = LoadArgs {
        files: vec![path.clone()],
        engine: EngineArgs {
            device: "auto".into(),
            threads: None,
            staging: None,
            slot: None,
            backend: BackendArg::Auto,
            direct: DirectArg::Auto,
            hot_route: HotArg::Auto,
            dma_window: None,
        },
        raw: false,
        per_tensor: false,
        verify: true,
        json: false,
    };
    load::run(&args)?;
    println!("== saving it as a checkpoint, then restoring that and comparing with the model");
    let ck = dir.join("demo-checkpoint");
    if ck.exists() {
        zerohop_checkpoint::remove(&ck)?;
    }
    checkpoint::run(CheckpointCommand::Save {
        from: vec![path.clone()],
        dir: ck.clone(),
        parent: None,
        shards: None,
        engine: args.engine.clone(),
        json: false,
    })?;
    checkpoint::run(CheckpointCommand::Restore {
        dir: ck,
        against: vec![path],
        engine: args.engine,
        json: false,
    })
}
