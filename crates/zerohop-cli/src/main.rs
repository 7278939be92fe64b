//! `zerohop`: move bytes between files and GPU memory at the hardware
//! limit (loads, checkpoints), and measure it.

mod agent;
mod bench;
mod checkpoint;
mod common;
mod demo;
mod gen;
mod info;
mod load;
mod progress;
mod verify;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "zerohop",
    version,
    about = "Move bytes between storage and GPU memory with no host hop"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What this machine supports: driver, GPUs, GDS, io_uring, O_DIRECT, staging.
    Info {
        /// A file or directory whose file system to check for O_DIRECT.
        path: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Write a synthetic transformer-shaped safetensors model (bf16, random).
    Gen {
        /// Approximate size, e.g. 8GiB, 512MiB, 1G.
        #[arg(long, value_parser = common::parse_size)]
        size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        out: PathBuf,
    },
    /// Load raw files or safetensors shards into device memory.
    Load(load::LoadArgs),
    /// Save, restore, verify, list and delete checkpoints of device memory.
    #[command(subcommand)]
    Checkpoint(checkpoint::CheckpointCommand),
    /// Benchmarks against the machine's limits.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run the I/O agent that serves other processes (`agent status`: ask one).
    Agent(agent::AgentArgs),
    /// Generate a demo model and load it (into the GPU, or host memory without one).
    Demo {
        #[arg(long, value_parser = common::parse_size, default_value = "1GiB")]
        size: u64,
        /// Where to write the demo model (default: the system temp directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`zerohop ... | head`), like other Unix
    // tools, instead of panicking inside println!.
    // SAFETY: restoring the default disposition of one signal at start-up,
    // before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { path, json } => info::run(path.as_deref(), json),
        Command::Gen { size, seed, out } => gen::run(&out, size, seed),
        Command::Load(args) => load::run(&args),
        Command::Checkpoint(cmd) => checkpoint::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Demo { size, dir } => demo::run(size, dir),
        Command::Agent(args) => agent::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop: error: {e}");
            ExitCode::FAILURE
        }
    }
}
