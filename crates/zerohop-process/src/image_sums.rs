//! A directory of image files made durable and checksummed, and checked
//! against those sums before it is used: a freeze's CRIU images. Files
//! are cut into chunks that threads hash side by side, so a damaged image
//! is named down to the chunk, and a large image is hashed at memory
//! speed.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::Path;
use zerohop::storage::{range_sums, sync_dir, FileRange, SourceFile};
use zerohop::{Error, ErrorKind, Result};

/// The bytes one checksum covers.
pub const CHUNK: u64 = 64 << 20;
/// At most this many hashing threads.
const MAX_THREADS: usize = 16;

/// One file of the directory: its name, size and the xxh3-64 of each
/// [`CHUNK`] in order (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageFile {
    pub name: String,
    pub size: u64,
    pub xxh3: Vec<String>,
}

/// Makes every regular file in `dir` (symbolic links are left to the
/// caller) and `dir` itself durable, and returns their sums, by name.
pub fn seal(dir: &Path) -> Result<Vec<ImageFile>> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "cannot list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "cannot list", e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| Error::io(&path, "cannot stat", e))?;
        if kind.is_symlink() {
            continue;
        }
        if !kind.is_file() {
            return Err(Error::invalid(format!(
                "{} is not a regular file: an image directory holds only files",
                path.display()
            )));
        }
        let name = entry
            .file_name()
            .into_string()
            .map_err(|n| Error::invalid(format!("{n:?} in {} is not UTF-8", dir.display())))?;
        let size = entry
            .metadata()
            .map_err(|e| Error::io(&path, "cannot stat", e))?
            .len();
        files.push((name, size));
    }
    files.sort();
    let sums = hash_all(dir, &files, true)?;
    sync_dir(dir)?;
    Ok(files
        .into_iter()
        .zip(sums)
        .map(|((name, size), xxh3)| ImageFile { name, size, xxh3 })
        .collect())
}

/// Checks that `files` can describe a directory: plain, distinct names
/// (nothing that leads out of it), and one 16-digit hex sum per [`CHUNK`].
pub fn validate(files: &[ImageFile]) -> Result<()> {
    let mut names = std::collections::HashSet::new();
    for f in files {
        let plain =
            !f.name.is_empty() && f.name != "." && f.name != ".." && !f.name.contains(['/', '\0']);
        if !plain || !names.insert(f.name.as_str()) {
            return Err(Error::format(format!(
                "{:?} is no image name (a plain file name, listed once)",
                f.name
            )));
        }
        let hex = |h: &String| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit());
        if f.xxh3.len() as u64 != f.size.div_ceil(CHUNK) || !f.xxh3.iter().all(hex) {
            return Err(Error::format(format!(
                "the entry for {} has {} sums for {} bytes, or sums that are not 16 hex digits",
                f.name,
                f.xxh3.len(),
                f.size
            )));
        }
    }
    Ok(())
}

/// Files CRIU itself writes into an image directory when it restores
/// from it, which a later check must let be.
const WRITTEN_BY_RESTORE: &[&str] = &["stats-restore"];

/// Checks `dir` against `files`: each is there, of its size, and every
/// chunk matches its sum; no other regular file is there (but what a
/// restore writes). The error names the first file (and byte range) that
/// does not match.
pub fn check(dir: &Path, files: &[ImageFile]) -> Result<()> {
    validate(files)?;
    for f in files {
        let path = dir.join(&f.name);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| {
            Error::io(&path, "cannot find", e).context(format!("{} is incomplete", dir.display()))
        })?;
        if !meta.is_file() || meta.len() != f.size {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!(
                    "{} is damaged: {} bytes where the manifest has {}",
                    path.display(),
                    meta.len(),
                    f.size
                ),
            ));
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "cannot list", e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let listed = files.iter().any(|f| name.to_str() == Some(f.name.as_str()))
            || name
                .to_str()
                .is_some_and(|n| WRITTEN_BY_RESTORE.contains(&n));
        if !listed && entry.file_type().is_ok_and(|t| t.is_file()) {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!(
                    "{} is not in the manifest: the images were changed after the freeze",
                    entry.path().display()
                ),
            ));
        }
    }
    let listed: Vec<(String, u64)> = files.iter().map(|f| (f.name.clone(), f.size)).collect();
    let sums = hash_all(dir, &listed, false)?;
    for (f, got) in files.iter().zip(&sums) {
        if let Some(i) = (0..got.len()).find(|&i| got[i] != f.xxh3[i]) {
            let start = i as u64 * CHUNK;
            return Err(Error::new(
                ErrorKind::Integrity,
                format!(
                    "{} is damaged: bytes {start} to {} do not match their checksum",
                    dir.join(&f.name).display(),
                    (start + CHUNK).min(f.size)
                ),
            ));
        }
    }
    Ok(())
}

/// The chunk sums of each of `files` (names in `dir`, with their sizes),
/// hashed by several threads; each file is synced to storage too where
/// `sync` is set.
fn hash_all(dir: &Path, files: &[(String, u64)], sync: bool) -> Result<Vec<Vec<String>>> {
    let opened: Vec<SourceFile> = files
        .iter()
        .map(|(name, _)| SourceFile::open(&dir.join(name)))
        .collect::<Result<_>>()?;
    // Every chunk in file order; an empty file has none.
    let ranges: Vec<FileRange> = files
        .iter()
        .enumerate()
        .flat_map(|(file, (_, size))| {
            (0..size.div_ceil(CHUNK)).map(move |c| FileRange {
                file,
                offset: c * CHUNK,
                len: CHUNK.min(size - c * CHUNK),
            })
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sums = range_sums(&opened, &ranges, threads.min(MAX_THREADS), None)?.into_iter();
    if sync {
        for (name, _) in files {
            let path = dir.join(name);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(&path, "cannot sync", e))?;
        }
    }
    Ok(files
        .iter()
        .map(|(_, size)| {
            (0..size.div_ceil(CHUNK))
                .map(|_| format!("{:016x}", sums.next().expect("one sum per chunk")))
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("zerohop-image-sums-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_sealed_directory_checks_and_any_change_is_named() {
        let dir = scratch("change");
        // Two chunks and a bit, one small file, an empty one, a link.
        let big: Vec<u8> = (0..2 * CHUNK + 5).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.join("pages-1.img"), &big).unwrap();
        std::fs::write(dir.join("core-7.img"), b"core").unwrap();
        std::fs::write(dir.join("empty.img"), b"").unwrap();
        std::os::unix::fs::symlink("../elsewhere", dir.join("parent")).unwrap();
        let files = seal(&dir).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["core-7.img", "empty.img", "pages-1.img"]);
        assert_eq!(files[2].xxh3.len(), 3);
        assert!(files[1].xxh3.is_empty());
        check(&dir, &files).unwrap();

        // One byte of the second chunk flipped: that chunk is named.
        let mut bad = big.clone();
        bad[CHUNK as usize + 9] ^= 1;
        std::fs::write(dir.join("pages-1.img"), &bad).unwrap();
        let e = check(&dir, &files).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Integrity);
        assert!(
            e.to_string().contains(&format!(
                "pages-1.img is damaged: bytes {CHUNK} to {}",
                2 * CHUNK
            )),
            "{e}"
        );
        // Cut short.
        std::fs::write(dir.join("pages-1.img"), &big[..100]).unwrap();
        let e = check(&dir, &files).unwrap_err();
        assert!(
            e.to_string().contains("100 bytes where the manifest has"),
            "{e}"
        );
        std::fs::write(dir.join("pages-1.img"), &big).unwrap();
        check(&dir, &files).unwrap();
        // Missing.
        std::fs::remove_file(dir.join("core-7.img")).unwrap();
        let e = check(&dir, &files).unwrap_err();
        assert!(
            e.to_string().contains("core-7.img") && e.to_string().contains("incomplete"),
            "{e}"
        );
        std::fs::write(dir.join("core-7.img"), b"core").unwrap();
        // A file the freeze did not write.
        std::fs::write(dir.join("extra.img"), b"x").unwrap();
        let e = check(&dir, &files).unwrap_err();
        assert!(
            e.to_string().contains("extra.img is not in the manifest"),
            "{e}"
        );
        std::fs::remove_file(dir.join("extra.img")).unwrap();
        // What a restore from the directory writes into it.
        std::fs::write(dir.join("stats-restore"), b"s").unwrap();
        check(&dir, &files).unwrap();
        // A manifest whose sums do not fit its size.
        let mut wrong = files.clone();
        wrong[2].xxh3.pop();
        assert_eq!(check(&dir, &wrong).unwrap_err().kind(), ErrorKind::Format);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_with_a_subdirectory_is_refused() {
        let dir = scratch("subdir");
        std::fs::create_dir(dir.join("nested")).unwrap();
        let e = seal(&dir).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
