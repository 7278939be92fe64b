//! Bytes that live away from this machine, as the engine reads them: the
//! interface `zerohop-s3` implements for an object in an object store, and
//! a run of its bytes read in order (what a read worker fills consecutive
//! windows from).

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

/// A run of a remote object's bytes, read window by window in file order
/// (see [`RemoteObject::read_stream`]).
pub(crate) struct RemoteStream {
    bytes: Box<dyn Read + Send>,
    /// File offset of the next byte `bytes` yields.
    pos: u64,
    end: u64,
}

impl RemoteStream {
    /// Opens `object`'s bytes `offset .. end`.
    pub(crate) fn open(object: &dyn RemoteObject, offset: u64, end: u64) -> std::io::Result<Self> {
        assert!(offset <= end, "a remote stream's range is reversed");
        Ok(RemoteStream {
            bytes: object.read_stream(offset, end)?,
            pos: offset,
            end,
        })
    }

    /// Fills `buf` from `offset` (at or past every byte read so far: what
    /// lies between is read and dropped), stopping early only where the
    /// stream ends. Returns the number of bytes read into `buf`.
    pub(crate) fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        assert!(
            offset >= self.pos,
            "remote windows are streamed in file order"
        );
        let gap = offset - self.pos;
        let skipped = std::io::copy(&mut (&mut self.bytes).take(gap), &mut std::io::sink())?;
        self.pos += skipped;
        if skipped < gap {
            return Ok(0);
        }
        let want = buf.len().min(self.end.saturating_sub(offset) as usize);
        let mut got = 0;
        while got < want {
            match self.bytes.read(&mut buf[got..want]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += got as u64;
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::MemoryObject;

    #[test]
    fn a_remote_stream_fills_windows_in_order_skipping_gaps() {
        let object = MemoryObject((0..=255u8).collect());
        let mut s = RemoteStream::open(&object, 10, 200).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read_at(10, &mut buf).unwrap(), 8);
        assert_eq!(buf, [10, 11, 12, 13, 14, 15, 16, 17]);
        // A gap is read through; the next window starts past it.
        assert_eq!(s.read_at(100, &mut buf[..3]).unwrap(), 3);
        assert_eq!(buf[..3], [100, 101, 102]);
        // The stream's end cuts the last window short.
        assert_eq!(s.read_at(196, &mut buf).unwrap(), 4);
        assert_eq!(buf[..4], [196, 197, 198, 199]);
        assert_eq!(s.read_at(250, &mut buf).unwrap(), 0);
    }

    #[test]
    #[should_panic(expected = "streamed in file order")]
    fn a_remote_stream_never_goes_back() {
        let object = MemoryObject(vec![7; 64]);
        let mut s = RemoteStream::open(&object, 0, 64).unwrap();
        let mut buf = [0u8; 16];
        s.read_at(16, &mut buf).unwrap();
        s.read_at(8, &mut buf).unwrap();
    }
}
