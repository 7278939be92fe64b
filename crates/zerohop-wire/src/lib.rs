//! What the zerohop agent and its clients share: the layout of the
//! submission/completion ring (a memfd both map), the control messages sent
//! over the agent's Unix socket with their descriptors, and sealed shared
//! memory; and the messages that ask a process to suspend its GPU memory.
//! Both sides link this crate; the agent treats everything it reads
//! from a client (messages, ring indices, entries) as untrusted.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod control;
pub mod ring;
pub mod shm;
pub mod socket;
pub mod suspend;

/// Version of the ring layout and control protocol; both must agree.
pub const PROTOCOL_VERSION: u32 = 1;
