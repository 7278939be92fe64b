//! `zerohop-lab`: the developers' benchmarks of zerohop against the
//! machine's limits, each limit measured in the same run. Users measure
//! their own machine with the shipped `zerohop bench load`.

mod agent;
mod agent_stress;
mod checkpoint;
mod checkpoint_s3;
mod raw_read;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "zerohop-lab",
    version,
    about = "zerohop's benchmarks against the machine's limits (for its developers)"
)]
struct Lab {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Save device memory as a checkpoint and restore it, against the raw
    /// write and read rates of the same directory (or object store).
    Checkpoint(checkpoint::BenchCheckpointArgs),
    /// Read FILE into this process's memory through the I/O agent (another
    /// process, `zerohop agent`) against the in-process engine, same run.
    Agent(agent::BenchAgentArgs),
    /// Many client processes doing mixed reads and writes through one
    /// agent; every I/O is checked.
    AgentStress(agent_stress::BenchAgentStressArgs),
    /// The raw read rate of files into host memory for one configuration:
    /// dropped from the page cache, then read by THREADS blocking reads of
    /// BLOCK bytes each from one in-order cursor.
    RawRead(raw_read::BenchRawReadArgs),
    /// One client of `agent-stress` (run by it).
    #[command(hide = true)]
    AgentClient(agent_stress::AgentClientArgs),
}

fn main() -> ExitCode {
    let result = match Lab::parse().command {
        Command::Checkpoint(a) => {
            match a.dir.to_str().filter(|d| zerohop::location::is_object(d)) {
                Some(url) => checkpoint_s3::run(&a, url),
                None => checkpoint::run(&a),
            }
        }
        Command::Agent(a) => agent::bench(&a),
        Command::AgentStress(a) => agent_stress::stress(&a),
        Command::RawRead(a) => raw_read::run(&a),
        Command::AgentClient(a) => agent_stress::client(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop-lab: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lab;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Lab::command().debug_assert();
    }
}
