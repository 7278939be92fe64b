//! Bytes that live away from this machine, as the engine reads them: the
//! interface `zerohop-s3` implements for an object in an object store.

use std::io::Read;

/// Bytes that live away from this machine (an object in an object store),
/// read by range. Implemented outside the engine (`zerohop-s3`): the engine
/// reads a [`SourceFile`](super::SourceFile) made with
/// [`SourceFile::remote`](super::SourceFile::remote) as it reads a local
/// one, into its staging slots.
pub trait RemoteObject: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `offset`, stopping early only at the object's end;
    /// returns the number of bytes read. Fails, saying so, where the object
    /// is no longer the one opened (replaced meanwhile): never mixed bytes.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize>;

    /// Bytes `offset .. end` (`end` at most the object's length), to be
    /// read in order: the read pipeline fills a run of consecutive windows
    /// from one stream, so the server sees few large requests while host
    /// memory stays in staging slots. The same guarantee as `read_at`:
    /// never bytes of another version.
    fn read_stream(&self, offset: u64, end: u64) -> std::io::Result<Box<dyn Read + Send>>;
}
