//! What one `fstat` tells of an open file: whether it is a regular file,
//! and whether it changed since it was opened, told by its length and its
//! modification time.

use crate::stats::human_bytes;
use std::fs::File;
use std::path::Path;

/// What one `fstat` said about a regular file: its length, and the
/// modification time that tells whether it changed since (see
/// [`FileStamp::changed_since`]). Not the status change time: a rename over
/// the file's path (an atomic replace, as zerohop's own saves do), a chmod
/// or a new hard link changes that while the bytes stay as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    pub len: u64,
    /// Modification time, (seconds, nanoseconds).
    modified: (i64, i64),
}

impl FileStamp {
    /// The stamp of `file`, which must be a regular file (`label` names it
    /// in errors, with what kind of file it is otherwise).
    pub(crate) fn of(file: &File, label: &Path) -> crate::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = file
            .metadata()
            .map_err(|e| crate::Error::io(label, "cannot stat", e))?;
        if let Some(e) = not_regular(&meta, label) {
            return Err(e);
        }
        Ok(FileStamp {
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
        })
    }

    /// How the file changed from `earlier` to this stamp, in words (`None`
    /// when it looks the same). Best effort: a same-size rewrite within one
    /// tick of the file system's clock, or one whose writer sets the old
    /// modification time back, leaves no trace here.
    pub(crate) fn changed_since(&self, earlier: &FileStamp) -> Option<String> {
        let (was, now) = (earlier.len, self.len);
        // Rounded sizes, unless rounding makes the two look alike.
        let (a, b) = match (human_bytes(was), human_bytes(now)) {
            (a, b) if a == b => (format!("{was} bytes"), format!("{now} bytes")),
            sizes => sizes,
        };
        Some(if now < was {
            format!("shrank from {a} to {b}")
        } else if now > was {
            format!("grew from {a} to {b}")
        } else if self.modified != earlier.modified {
            "was modified".to_string()
        } else {
            return None;
        })
    }
}

/// The error for a file that is not regular, naming what it is; `None` for
/// a regular file.
pub(super) fn not_regular(meta: &std::fs::Metadata, label: &Path) -> Option<crate::Error> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "a file of an unknown kind"
    };
    Some(crate::Error::invalid(format!(
        "{} is {kind}, not a regular file",
        label.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::FileStamp;

    fn stamp(len: u64, modified: i64) -> FileStamp {
        FileStamp {
            len,
            modified: (modified, 0),
        }
    }

    #[test]
    fn changes_are_told_apart_in_words() {
        let was = stamp(4 << 20, 1);
        assert_eq!(
            stamp(2 << 20, 1).changed_since(&was).unwrap(),
            "shrank from 4 MiB to 2 MiB"
        );
        // Sizes that round alike are given exactly.
        assert_eq!(
            stamp((4 << 20) - 100, 1).changed_since(&was).unwrap(),
            "shrank from 4194304 bytes to 4194204 bytes"
        );
        assert_eq!(
            stamp(4 << 20, 2).changed_since(&was).unwrap(),
            "was modified"
        );
        assert_eq!(stamp(4 << 20, 1).changed_since(&was), None);
    }
}
