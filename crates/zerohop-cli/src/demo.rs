//! `zerohop demo`: generate a model, load it, checkpoint it and restore it,
//! in a working directory of its own that is removed at the end (on an
//! error, or Ctrl-C, too) unless `--keep` is given.

use crate::checkpoint;
use crate::load::{self, LoadArgs};
use clap::Args;
use std::path::{Path, PathBuf};
use zerohop::{Error, Result};
use zerohop_checkpoint::Location;
use zerohop_cmd::engine_args::EngineArgs;
use zerohop_cmd::size::{human_bytes, ByteSize};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the demo model (the checkpoint takes as much again); not 0.
    #[arg(long, default_value_t = ByteSize(1 << 30), value_parser = |s: &str| zerohop_cmd::size::parse_length(s).map(ByteSize))]
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
    if !a.keep {
        remove_on_interrupt(work.path.clone())?;
    }
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
    zerohop_cmd::gen::run(&zerohop_cmd::gen::GenArgs::model(&model, a.size.0))?;
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
        &Location::dir(&ck)?,
        None,
        None,
        false,
    )?;
    checkpoint::restore(&engine, &Location::dir(&ck)?, &[model], false)
}

/// Ctrl-C (SIGINT) or SIGTERM removes `dir` and ends the process with the
/// shell's status for the signal (128 + its number). The signals are
/// blocked in this thread before the engine's threads start (they inherit
/// the mask), and one thread of its own waits for them.
fn remove_on_interrupt(dir: PathBuf) -> Result<()> {
    // SAFETY: `set` is initialised by sigemptyset before use, and
    // pthread_sigmask only changes this thread's mask.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Error::io(
                &dir,
                "cannot block SIGINT for",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        set
    };
    std::thread::Builder::new()
        .name("demo-interrupt".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: waits for one of the signals blocked above.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                // Again if a step still running wrote into it meanwhile.
                for _ in 0..3 {
                    if std::fs::remove_dir_all(&dir).is_ok() {
                        break;
                    }
                }
                eprintln!("\n== interrupted: removed {}", dir.display());
                std::process::exit(128 + sig);
            }
        })
        .map_err(|e| {
            Error::io(
                Path::new("."),
                "cannot start the demo's signal thread in",
                e,
            )
        })?;
    Ok(())
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
