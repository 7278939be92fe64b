//! `zerohop`: move bytes between files and GPU memory at the hardware
//! limit (loads, checkpoints), and measure it on this machine. The
//! developers' benchmarks are another program, `zerohop-lab`.

mod agent;
mod bench;
mod checkpoint;
mod demo;
mod freeze;
mod info;
mod load;
mod process;
mod suspend;
mod verify;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "zerohop",
    version,
    about = "Move bytes between storage and GPU memory through a small pinned staging pool, reads and copies overlapped (hot files by DMA from the page cache where that is faster)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What this machine supports: driver, GPUs, GDS, io_uring, O_DIRECT, staging, CRIU.
    Info {
        /// A file or directory whose file system to check for O_DIRECT
        /// (default: none checked).
        path: Option<PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a synthetic transformer-shaped safetensors model (random values):
    /// bf16 or fp8, dense or of many small tensors, one file or shards.
    Gen(zerohop_cmd::gen::GenArgs),
    /// Load raw files or safetensors shards into device memory.
    Load(load::LoadArgs),
    /// Save, restore, verify, list and delete checkpoints of device memory.
    #[command(subcommand)]
    Checkpoint(checkpoint::CheckpointCommand),
    /// This machine's rates: a load beside the limits it is judged against.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run the I/O agent that serves other processes (`agent status`: ask one).
    Agent(agent::AgentArgs),
    /// Ask a process to write its suspendable GPU memory to a checkpoint
    /// and hand the memory back (it serves requests: zerohop.serve_suspend).
    Suspend(suspend::SuspendArgs),
    /// Ask a suspended process to take its GPU memory back, restored from
    /// the checkpoint and verified, at the same addresses.
    Resume(suspend::ResumeArgs),
    /// Checkpoint a CUDA process with the driver (cuCheckpointProcess*),
    /// its suspendable GPU memory sent to storage through zerohop first.
    CheckpointProcess(process::CheckpointProcessArgs),
    /// Restore a process that `checkpoint-process` checkpointed: the
    /// driver's part, then zerohop's memory, verified.
    RestoreProcess(process::RestoreProcessArgs),
    /// Freeze a whole process into a directory: its GPU state through
    /// zerohop and the driver, the rest by CRIU; durable when it returns.
    Freeze(freeze::FreezeArgs),
    /// Bring a frozen process back under its own pid, its images checked
    /// and its GPU memory verified.
    Thaw(freeze::ThawArgs),
    /// Generate a demo model, load it, checkpoint it and restore it.
    ///
    /// Into the GPU, or host memory without one. Its files are removed at
    /// the end unless --keep.
    Demo(demo::DemoArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time loads of FILE against the pinned H2D limit and the raw read rate.
    Load(bench::BenchLoadArgs),
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`zerohop ... | head`), like other Unix
    // tools, instead of panicking inside println!.
    // (libc: rustix has no safe call that sets a signal's disposition.)
    // SAFETY: restoring the default disposition of one signal at start-up,
    // before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // With one thread, growing the table waits for nothing; with the
    // engine's threads, every growth inside an `open` would. Best effort.
    let _ = zerohop::storage::grow_descriptor_table();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { path, json } => info::run(path.as_deref(), json),
        Command::Gen(args) => zerohop_cmd::gen::run(&args),
        Command::Load(args) => load::run(&args),
        Command::Checkpoint(cmd) => checkpoint::run(cmd),
        Command::Bench(BenchCommand::Load(args)) => bench::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Agent(args) => agent::run(args),
        Command::Suspend(args) => suspend::suspend(&args),
        Command::Resume(args) => suspend::resume(&args),
        Command::CheckpointProcess(args) => process::checkpoint(&args),
        Command::RestoreProcess(args) => process::restore(&args),
        Command::Freeze(args) => freeze::freeze(&args),
        Command::Thaw(args) => freeze::thaw(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every subcommand, hidden ones too, says what it is
    /// in `--help`; one that takes a value and may be left out either has
    /// a default clap shows or says its default in its text.
    #[test]
    fn every_argument_has_help_and_shows_its_default() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {id}: no help text"));
                }
                let optional_value = arg.get_action().takes_values()
                    && !arg.is_required_set()
                    && arg.get_default_values().is_empty();
                if optional_value && !help.contains("default") {
                    missing.push(format!("{path} {id}: no default shown"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "zerohop", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
        // The walk reaches the nested subcommands.
        let ls = cmd
            .find_subcommand("checkpoint")
            .unwrap()
            .find_subcommand("ls");
        assert!(ls.unwrap().get_arguments().any(|a| a.get_id() == "json"));
    }
}
