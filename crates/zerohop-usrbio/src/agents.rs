//! The agents this process talks to, and which directories (USRBIO's mount
//! points) each serves. Agents are found at the sockets named in
//! `ZEROHOP_AGENT_SOCKET` (colon-separated; default: the agent's default
//! socket), connected on first need and kept for the process.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use zerohop_client::Client;

/// One agent's session, shared by every iov, ring and file of this process
/// that it serves.
pub struct Agent {
    pub client: Client,
    socket: PathBuf,
    served: Vec<PathBuf>,
}

static AGENTS: Mutex<Vec<Arc<Agent>>> = Mutex::new(Vec::new());

fn sockets() -> Vec<PathBuf> {
    match std::env::var_os("ZEROHOP_AGENT_SOCKET") {
        Some(list) if !list.is_empty() => list
            .as_bytes()
            .split(|b| *b == b':')
            .filter(|s| !s.is_empty())
            .map(|s| PathBuf::from(OsStr::from_bytes(s)))
            .collect(),
        _ => vec![zerohop_client::default_socket_path()],
    }
}

/// The agent serving `path` (which need not exist), and the served
/// directory holding it; None where no agent serves it (or none answers).
pub fn serving(path: &Path) -> Option<(Arc<Agent>, PathBuf)> {
    let path = resolve(path)?;
    let mut agents = AGENTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = find(&agents, &path) {
        return Some(found);
    }
    // Agents not connected yet (or started since the last look).
    for socket in sockets() {
        if agents.iter().any(|a| a.socket == socket) {
            continue;
        }
        if let Ok(agent) = connect(&socket) {
            agents.push(Arc::new(agent));
        }
    }
    find(&agents, &path)
}

fn find(agents: &[Arc<Agent>], path: &Path) -> Option<(Arc<Agent>, PathBuf)> {
    agents
        .iter()
        .flat_map(|a| a.served.iter().map(move |d| (a, d)))
        .filter(|(_, d)| path.starts_with(d))
        .max_by_key(|(_, d)| d.as_os_str().len())
        .map(|(a, d)| (a.clone(), d.clone()))
}

fn connect(socket: &Path) -> io::Result<Agent> {
    let client = Client::connect(socket)?;
    let served = client
        .status()?
        .served
        .into_iter()
        .map(PathBuf::from)
        .collect();
    Ok(Agent {
        client,
        socket: socket.to_path_buf(),
        served,
    })
}

/// `path` made absolute with its existing part's links resolved, as the
/// agent names its served directories; the part that does not exist yet
/// is appended as written (without `.` or `..`).
fn resolve(path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        // None for a missing part that ends in `..`.
        rest.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_through_links_and_missing_parts() {
        let dir =
            std::env::temp_dir().join(format!("zerohop-usrbio-resolve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("real")).unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("real"), &link).unwrap();
        let real = std::fs::canonicalize(dir.join("real")).unwrap();
        assert_eq!(resolve(&link.join("a/b.bin")), Some(real.join("a/b.bin")));
        assert_eq!(resolve(&link), Some(real.clone()));
        assert_eq!(resolve(&link.join("missing/../x")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
