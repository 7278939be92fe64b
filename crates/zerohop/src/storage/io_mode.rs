//! How a local file's bytes are read or written: through the page cache or
//! with O_DIRECT, and the alignment O_DIRECT asks for.

/// How a file's bytes are read or written: through the page cache or with
/// O_DIRECT (a storage mode that both staged routes and saves use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// Through the page cache.
    Buffered,
    /// O_DIRECT: storage DMA straight into the staging slot.
    Direct,
}

/// Alignment used for O_DIRECT offsets, lengths and buffers. 4 KiB satisfies
/// every common logical block size (512 B and 4 KiB).
pub const DIRECT_ALIGN: u64 = 4096;
