//! Requests to a process that serves the suspend and resume of its GPU
//! memory (`zerohop suspend PID DIR`, `zerohop resume PID DIR`): one JSON
//! message each way on a `SOCK_SEQPACKET` socket at [`socket_path`], sent
//! and received as the agent's control messages are (`control::send`,
//! `control::recv`).

use crate::control::decode_limited;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What the `zerohop` command asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SuspendRequest {
    /// Suspend to a new checkpoint at `dir` (absolute), incrementally
    /// against `parent` if given.
    Suspend {
        dir: String,
        parent: Option<String>,
    },
    /// Resume from the checkpoint at `dir` (absolute).
    Resume {
        dir: String,
    },
    Status,
}

/// The process's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SuspendReply {
    /// Suspended or resumed: the seconds it took and the bytes written
    /// (suspend) or restored (resume).
    Done {
        seconds: f64,
        bytes: u64,
    },
    Status(HeapStatus),
    Error {
        message: String,
    },
}

/// A serving process's heap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeapStatus {
    pub pid: u32,
    pub allocations: u64,
    pub bytes: u64,
    /// Device memory behind the heap now (0 while suspended).
    pub backed_bytes: u64,
    pub suspended_to: Option<String>,
}

/// Where process `pid` serves suspend requests: beside the agent's
/// default socket (`$XDG_RUNTIME_DIR`, else `/tmp`).
pub fn socket_path(pid: u32) -> PathBuf {
    let agent = crate::socket::default_path();
    let dir = agent
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp".into());
    dir.join(format!("zerohop-suspend-{pid}.sock"))
}

/// Decodes a request from untrusted bytes.
pub fn decode_suspend_request(bytes: &[u8]) -> Result<SuspendRequest, String> {
    decode_limited(bytes, "request")
}

pub fn decode_suspend_reply(bytes: &[u8]) -> Result<SuspendReply, String> {
    decode_limited(bytes, "reply")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::encode;

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        for r in [
            SuspendRequest::Suspend {
                dir: "/a".into(),
                parent: Some("/b".into()),
            },
            SuspendRequest::Resume { dir: "/a".into() },
            SuspendRequest::Status,
        ] {
            assert_eq!(decode_suspend_request(&encode(&r)).unwrap(), r);
        }
        let reply = SuspendReply::Status(HeapStatus {
            pid: 7,
            suspended_to: Some("/x".into()),
            ..HeapStatus::default()
        });
        assert_eq!(decode_suspend_reply(&encode(&reply)).unwrap(), reply);
        for bad in [
            &b"{\"suspend\":{\"dir\":1}}"[..],
            b"{\"status\":null,\"x\":1}",
            b"",
            b"[]",
        ] {
            assert!(
                decode_suspend_request(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b' '; crate::control::MAX_MESSAGE_BYTES + 1];
        assert!(decode_suspend_request(&long)
            .unwrap_err()
            .contains("over the limit"));
        assert!(socket_path(42)
            .to_string_lossy()
            .ends_with("zerohop-suspend-42.sock"));
    }
}
