//! `zerohop bench ...`: measurements against the machine's limits, each
//! beside the limits it is judged against, measured in the same run.

mod agent;
mod agent_stress;
mod checkpoint;
mod checkpoint_s3;
mod load;
mod raw_io;
mod raw_read;

use clap::Subcommand;
use zerohop::Result;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time loads of FILE against the pinned H2D limit and the raw read rate.
    Load(load::BenchLoadArgs),
    /// Save device memory as a checkpoint and restore it, against the raw
    /// write and read rates of the same directory (or object store).
    Checkpoint(checkpoint::BenchCheckpointArgs),
    /// Read FILE into this process's memory through the I/O agent (another
    /// process) against the in-process engine, same run.
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

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Load(a) => load::run(&a),
        BenchCommand::Checkpoint(a) => checkpoint::run(&a),
        BenchCommand::Agent(a) => agent::bench(&a),
        BenchCommand::AgentStress(a) => agent_stress::stress(&a),
        BenchCommand::RawRead(a) => raw_read::run(&a),
        BenchCommand::AgentClient(a) => agent_stress::client(&a),
    }
}
