//! What the machine makes available: whether something is, its version,
//! and why not (an [`Availability`]); and how many CPUs this process may
//! use, which the engine's default settings also size themselves by.

use serde::Serialize;

/// Whether something is available here: its version where it has one, or
/// why it is not. JSON: `{"available": bool, "version": str | null,
/// "why_not": str | null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Availability {
    pub available: bool,
    pub version: Option<String>,
    pub why_not: Option<String>,
}

impl Availability {
    pub fn available(version: Option<String>) -> Self {
        Availability {
            available: true,
            version,
            why_not: None,
        }
    }

    pub fn unavailable(why_not: impl Into<String>) -> Self {
        Availability {
            available: false,
            version: None,
            why_not: Some(why_not.into()),
        }
    }

    pub(super) fn of(r: Result<(), String>) -> Self {
        match r {
            Ok(()) => Self::available(None),
            Err(why) => Self::unavailable(why),
        }
    }
}

/// Number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
