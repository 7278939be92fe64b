use super::file_pair::{BlockReader, FilePair, IoMode, ReadBackend, DIRECT_ALIGN};
use std::io;
use std::os::unix::fs::FileExt;

/// Blocking `pread` from each worker thread: works everywhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreadBackend;

impl ReadBackend for PreadBackend {
    fn name(&self) -> &'static str {
        "pread"
    }
    fn reader(&self) -> io::Result<Box<dyn BlockReader>> {
        Ok(Box::new(PreadBackend))
    }
}

impl BlockReader for PreadBackend {
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let fd = file.fd_for(mode);
        let mut done = 0;
        while done < buf.len() {
            match fd.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            // O_DIRECT continues only from aligned positions; a short direct
            // read that is not at EOF would leave one, so stop and let the
            // caller decide (it is an error unless the file ended).
            if mode == IoMode::Direct && done % DIRECT_ALIGN as usize != 0 {
                break;
            }
        }
        Ok(done)
    }
}
