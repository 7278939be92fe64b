//! The crate's operations on checkpoints named by their directory, as the
//! tests name them.
#![allow(dead_code)] // each test binary uses some

use std::path::Path;
use zerohop::{DeviceBuffer, Engine, Progress, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, Location, Region, Restored, SaveOptions, Saved, Verified};

pub fn at(dir: &Path) -> Location {
    Location::dir(dir).unwrap()
}

pub fn save(
    e: &Engine,
    regions: &[Region],
    dir: &Path,
    opts: &SaveOptions,
    progress: Option<Progress<'_>>,
) -> Result<Saved> {
    ckpt::save(e, regions, &Location::dir(dir)?, opts, progress)
}

pub fn restore(e: &Engine, dir: &Path, progress: Option<Progress<'_>>) -> Result<Restored> {
    ckpt::restore(e, &Location::dir(dir)?, progress)
}

pub fn restore_into(
    e: &Engine,
    dir: &Path,
    targets: &[(&str, DeviceBuffer)],
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    ckpt::restore_into(e, &Location::dir(dir)?, targets, progress)
}

pub fn verify(dir: &Path, threads: usize, progress: Option<Progress<'_>>) -> Result<Verified> {
    ckpt::verify(&Location::dir(dir)?, threads, progress)
}

pub fn remove(dir: &Path) -> Result<()> {
    ckpt::remove(&Location::dir(dir)?)
}
