//! What a read backend is: a way of reading local files, one reader per
//! I/O worker.

use super::file_pair::FilePair;
use super::io_mode::IoMode;
use std::io;

/// A way of reading files; each I/O worker gets its own [`BlockReader`].
pub trait ReadBackend: Send + Sync {
    fn name(&self) -> &'static str;
    fn reader(&self) -> io::Result<Box<dyn BlockReader>>;
}

/// One worker's reader of local files (see
/// [`SourceFile::read_block`](super::SourceFile::read_block)).
pub trait BlockReader: Send {
    /// Fills `buf` from `offset`, stopping early only at end of file.
    /// Returns the number of bytes read. With `IoMode::Direct`, `offset`,
    /// `buf.len()` and the buffer address are multiples of
    /// [`DIRECT_ALIGN`](super::DIRECT_ALIGN).
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize>;
}
