//! `zerohop agent`: run the I/O agent in the foreground, or ask one for its
//! status.

use clap::{Args, Subcommand};
use std::path::PathBuf;
use zerohop::{Error, ErrorKind, Result};
use zerohop_agent::{default_socket_path, AgentConfig};
use zerohop_cmd::size::human_bytes;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum AgentCommand {
    /// Clients, registered buffers and rings, bytes and I/Os served, errors.
    Status {
        /// The agent's socket (default: as for `zerohop agent`).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Unix socket to listen on (default: $XDG_RUNTIME_DIR/zerohop.sock,
    /// else /tmp/zerohop-UID.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Let the socket's group connect too (default: the owner only).
    #[arg(long)]
    group: bool,
    // The GPU whose memory clients may register (host: none; host memory
    // is always served).
    #[arg(long, default_value = "auto", help = zerohop::device::DEVICE_HELP)]
    device: String,
    /// error, warn, info, debug or trace.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Clients connected at once; more are refused.
    #[arg(long, default_value_t = 1024)]
    max_clients: usize,
    /// Serve the files under DIR only (repeatable): USRBIO programs
    /// (libhf3fs_api_shared.so) see each DIR as a mount point (default:
    /// any file a client opened, and no mount points).
    #[arg(long = "serve", value_name = "DIR")]
    served: Vec<PathBuf>,
}

pub fn run(args: AgentArgs) -> Result<()> {
    match args.command {
        Some(AgentCommand::Status { socket, json }) => status(socket, json),
        None => {
            let s = args.serve;
            zerohop_agent::init_logging(&s.log_level).map_err(Error::invalid)?;
            zerohop_agent::run(&AgentConfig {
                socket: s.socket.unwrap_or_else(default_socket_path),
                group_access: s.group,
                device: s.device,
                max_clients: s.max_clients,
                served: s.served,
            })
        }
    }
}

fn status(socket: Option<PathBuf>, json: bool) -> Result<()> {
    let path = socket.unwrap_or_else(default_socket_path);
    let st = zerohop_agent::query_status(&path).map_err(|e| {
        Error::with_source(
            ErrorKind::Io,
            format!("no agent answers at {}", path.display()),
            e,
        )
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&st).expect("status serializes")
        );
        return Ok(());
    }
    println!("agent    pid {} serving {}", st.pid, st.device);
    if !st.served.is_empty() {
        println!("files    under {}", st.served.join(", "));
    }
    println!(
        "served   {} I/Os, {} read, {} written, {} errors; {} sessions since start",
        st.ios,
        human_bytes(st.bytes_read),
        human_bytes(st.bytes_written),
        st.errors,
        st.sessions_total
    );
    println!("clients  {}", st.clients.len());
    for c in &st.clients {
        println!(
            "  session {:<5} pid {:<8} files {:<4} host buffers {:<4} device buffers {:<4} rings {:<3} {} I/Os, {}, {} errors",
            c.session, c.pid, c.files, c.host_buffers, c.device_buffers, c.rings, c.ios, human_bytes(c.bytes), c.errors
        );
    }
    Ok(())
}
