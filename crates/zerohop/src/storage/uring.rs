use super::file_pair::{BlockReader, FilePair, IoMode, ReadBackend, DIRECT_ALIGN};
use io_uring::{opcode, types, IoUring};
use rustix::io::Errno;
use std::io;
use std::os::fd::AsRawFd;

/// Each worker owns an io_uring and splits every read into segments kept in
/// flight together, so one worker keeps several requests at the device.
#[derive(Debug, Clone, Copy)]
pub struct UringBackend {
    segment: usize,
}

/// Requests one reader keeps in flight at most.
const DEPTH: u32 = 16;

impl UringBackend {
    /// Checks that this kernel lets us create a ring (seccomp or an old kernel
    /// may not).
    pub fn probe() -> io::Result<Self> {
        IoUring::new(2)?;
        Ok(UringBackend {
            segment: DEFAULT_SEGMENT,
        })
    }

    /// Splits reads into segments of `bytes` (a multiple of
    /// [`DIRECT_ALIGN`], so O_DIRECT reads stay
    /// aligned).
    pub fn with_segment(self, bytes: usize) -> Self {
        UringBackend { segment: bytes }
    }
}

/// Bytes per request by default.
pub const DEFAULT_SEGMENT: usize = 1 << 20;

impl ReadBackend for UringBackend {
    fn name(&self) -> &'static str {
        "io_uring"
    }
    fn reader(&self) -> io::Result<Box<dyn BlockReader>> {
        Ok(Box::new(UringReader {
            ring: IoUring::new(DEPTH)?,
            segment: self.segment,
        }))
    }
}

struct UringReader {
    ring: IoUring,
    segment: usize,
}

struct Segment {
    start: usize,
    len: usize,
    done: usize,
    eof: bool,
    in_flight: bool,
}

impl Segment {
    fn wants_read(&self) -> bool {
        !self.in_flight && !self.eof && self.done < self.len
    }
}

impl BlockReader for UringReader {
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let fd = types::Fd(file.fd_for(mode).as_raw_fd());
        let mut segs: Vec<Segment> = (0..buf.len())
            .step_by(self.segment.max(1))
            .map(|start| Segment {
                start,
                len: self.segment.min(buf.len() - start),
                done: 0,
                eof: false,
                in_flight: false,
            })
            .collect();
        let mut in_flight = 0u32;
        let mut failure: Option<io::Error> = None;
        loop {
            // Queue every segment that still needs bytes, up to the ring depth.
            if failure.is_none() {
                for (i, s) in segs.iter_mut().enumerate() {
                    if in_flight >= DEPTH {
                        break;
                    }
                    if !s.wants_read() {
                        continue;
                    }
                    let at = s.start + s.done;
                    let entry =
                        opcode::Read::new(fd, buf[at..].as_mut_ptr(), (s.len - s.done) as u32)
                            .offset(offset + at as u64)
                            .build()
                            .user_data(i as u64);
                    // SAFETY: the buffer range stays borrowed until this loop
                    // has reaped every in-flight entry (we never return while
                    // `in_flight > 0`), and the fd outlives the call.
                    if unsafe { self.ring.submission().push(&entry) }.is_err() {
                        break;
                    }
                    s.in_flight = true;
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                break;
            }
            // Errors here (EBUSY, EAGAIN: a full completion queue or kernel
            // memory pressure) are transient: keep reaping, because entries
            // the kernel took still own the buffer; the first error is
            // returned once nothing is in flight.
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.kind() != io::ErrorKind::Interrupted {
                    failure.get_or_insert(e);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            for cqe in self.ring.completion() {
                let s = &mut segs[cqe.user_data() as usize];
                s.in_flight = false;
                in_flight -= 1;
                match cqe.result() {
                    r if r == -Errno::INTR.raw_os_error() || r == -Errno::AGAIN.raw_os_error() => {}
                    r if r < 0 => {
                        failure.get_or_insert(io::Error::from_raw_os_error(-r));
                    }
                    0 => s.eof = true,
                    r => {
                        s.done += r as usize;
                        // A short O_DIRECT read only happens at end of file;
                        // continuing from an unaligned position would fail.
                        if mode == IoMode::Direct && !s.done.is_multiple_of(DIRECT_ALIGN as usize) {
                            s.eof = true;
                        }
                    }
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let mut total = 0;
        for s in &segs {
            total += s.done;
            if s.done < s.len {
                break;
            }
        }
        Ok(total)
    }
}
