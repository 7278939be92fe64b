//! Where a load puts each tensor: small tensors share blocks of device
//! memory (disjoint views of one allocation), and the engine's pieces follow
//! from the blocks' addresses. A `Layout` plans a whole load of safetensors
//! files here, so that a model of thousands of tensors starts its transfer
//! before Python makes an object per tensor (that work then runs beside
//! the transfer).

use crate::errors::to_py;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;
use zerohop::safetensors::read_header;
use zerohop::{Error, Result};

/// Each start in a block is a multiple of this (bytes).
const BLOCK_ALIGN: u64 = 512;

/// A tensor's place: (block, offset in it), or None where it is allocated
/// alone.
type Place = Option<(usize, u64)>;

/// A piece for the engine: (file index, file offset, bytes, address).
pub type Piece = (usize, u64, u64, u64);

/// Where a tensor of each of `sizes` (bytes) goes: blocks filled in order,
/// each start aligned, no block over `block_bytes`. None for a size of 0
/// or of at least `block_bytes`, and for a tensor asked for alone: those
/// are allocated alone.
pub fn places(sizes: &[u64], block_bytes: u64) -> Vec<Place> {
    if sizes.len() == 1 {
        return vec![None];
    }
    let mut out = Vec::with_capacity(sizes.len());
    let (mut block, mut used) = (None::<usize>, block_bytes);
    for &n in sizes {
        if n == 0 || n >= block_bytes {
            out.push(None);
            continue;
        }
        let mut at = used.div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN;
        let current = match block {
            Some(b) if at + n <= block_bytes => b,
            _ => {
                at = 0;
                block.map_or(0, |b| b + 1)
            }
        };
        block = Some(current);
        out.push(Some((current, at)));
        used = at + n;
    }
    out
}

/// The engine's pieces for tensors given as (file, begin, bytes, address,
/// block): tensors of one block that follow each other in the file and in
/// memory are one piece (a copy never spans two allocations); empty ones
/// are none.
pub fn pieces(
    tensors: impl IntoIterator<Item = (usize, u64, u64, u64, Option<usize>)>,
) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut last_block = None;
    for (file, begin, n, addr, block) in tensors {
        let joins = block.is_some()
            && block == last_block
            && out.last().is_some_and(|p| {
                p.0 == file
                    && p.1.checked_add(p.2) == Some(begin)
                    && p.3.checked_add(p.2) == Some(addr)
            });
        if joins {
            out.last_mut().expect("checked").2 += n;
        } else if n > 0 {
            out.push((file, begin, n, addr));
        }
        last_block = block;
    }
    out
}

/// `places` for Python: (block, offset) or None for each size.
#[pyfunction]
pub fn plan_blocks(sizes: Vec<u64>, block_bytes: u64) -> Vec<Place> {
    places(&sizes, block_bytes)
}

/// `pieces` for Python, of (file, begin, bytes, address, block) tuples.
#[pyfunction]
pub fn pieces_of(tensors: Vec<(usize, u64, u64, u64, Option<usize>)>) -> Vec<Piece> {
    pieces(tensors)
}

struct Entry {
    file: usize,
    name: String,
    dtype: &'static str,
    shape: Vec<u64>,
    /// Absolute offset in its file.
    begin: u64,
    bytes: u64,
    place: Place,
}

/// Every tensor of some safetensors files, in the files' order, placed in
/// blocks of device memory.
#[pyclass(frozen)]
pub struct Layout {
    entries: Vec<Entry>,
    blocks: usize,
}

/// The layout of a load of `paths`' tensors, blocks of at most
/// `block_bytes`. A name in two files is refused, as `load_file` refuses it.
#[pyfunction]
pub fn safetensors_layout(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    block_bytes: u64,
) -> PyResult<Layout> {
    py.detach(|| Layout::of(&paths, block_bytes)).map_err(to_py)
}

impl Layout {
    fn of(paths: &[PathBuf], block_bytes: u64) -> Result<Layout> {
        let files = zerohop_names::open_sources(paths)?;
        let mut entries = Vec::new();
        let mut first_file: HashMap<String, usize> = HashMap::new();
        for (i, file) in files.iter().enumerate() {
            let header = read_header(file)?;
            for t in header.tensors {
                if let Some(&other) = first_file.get(&t.name) {
                    return Err(Error::invalid(format!(
                        "tensor {:?} is in both {} and {}",
                        t.name,
                        paths[other].display(),
                        paths[i].display()
                    )));
                }
                first_file.insert(t.name.clone(), i);
                entries.push(Entry {
                    file: i,
                    bytes: t.len(),
                    begin: header.data_start + t.begin,
                    name: t.name,
                    dtype: t.dtype.name(),
                    shape: t.shape,
                    place: None,
                });
            }
        }
        let sizes: Vec<u64> = entries.iter().map(|e| e.bytes).collect();
        let planned = places(&sizes, block_bytes);
        let blocks = planned.iter().flatten().map(|p| p.0 + 1).max().unwrap_or(0);
        for (e, place) in entries.iter_mut().zip(planned) {
            e.place = place;
        }
        Ok(Layout { entries, blocks })
    }
}

#[pymethods]
impl Layout {
    fn __len__(&self) -> usize {
        self.entries.len()
    }

    /// Each block's bytes: up to the end of its last tensor.
    fn block_ends(&self) -> Vec<u64> {
        let mut ends = vec![0; self.blocks];
        for e in &self.entries {
            if let Some((b, at)) = e.place {
                ends[b] = ends[b].max(at + e.bytes);
            }
        }
        ends
    }

    /// The tensors allocated alone, in order: (index, dtype, shape).
    fn alone(&self) -> Vec<(usize, &'static str, Vec<u64>)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.place.is_none())
            .map(|(i, e)| (i, e.dtype, e.shape.clone()))
            .collect()
    }

    /// The engine's pieces, given each block's address and those of the
    /// tensors allocated alone (in the order of `alone`).
    fn pieces(&self, blocks: Vec<u64>, alone: Vec<u64>) -> PyResult<Vec<Piece>> {
        let lone = self.entries.iter().filter(|e| e.place.is_none()).count();
        if blocks.len() != self.blocks || alone.len() != lone {
            return Err(to_py(Error::invalid(format!(
                "{} block and {} tensor addresses for a layout of {} blocks and {} tensors alone",
                blocks.len(),
                alone.len(),
                self.blocks,
                lone
            ))));
        }
        let mut alone = alone.into_iter();
        Ok(pieces(self.entries.iter().map(|e| {
            let addr = match e.place {
                Some((b, at)) => blocks[b] + at,
                None => alone.next().expect("counted"),
            };
            (e.file, e.begin, e.bytes, addr, e.place.map(|p| p.0))
        })))
    }

    /// Every tensor's (dtype, shape, bytes), in order.
    fn specs(&self) -> Vec<(&'static str, Vec<u64>, u64)> {
        self.entries
            .iter()
            .map(|e| (e.dtype, e.shape.clone(), e.bytes))
            .collect()
    }

    /// Each block's tensors by dtype, dtypes in the order they first come:
    /// (dtype, [(index, offset)]).
    #[allow(clippy::type_complexity)]
    fn members(&self) -> Vec<Vec<(&'static str, Vec<(usize, u64)>)>> {
        let mut out: Vec<Vec<(&'static str, Vec<(usize, u64)>)>> = vec![Vec::new(); self.blocks];
        for (i, e) in self.entries.iter().enumerate() {
            if let Some((b, at)) = e.place {
                match out[b].iter_mut().find(|(d, _)| *d == e.dtype) {
                    Some((_, members)) => members.push((i, at)),
                    None => out[b].push((e.dtype, vec![(i, at)])),
                }
            }
        }
        out
    }

    /// Every tensor's name, in order.
    fn names(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fill_in_order_aligned_and_a_lone_tensor_stays_alone() {
        let sizes = [100, 0, 1000, 3000, 5000, 4096, 1, 10_000, 8];
        let p = places(&sizes, 8192);
        assert_eq!(p[0], Some((0, 0)));
        assert_eq!(p[1], None, "empty");
        assert_eq!(p[2], Some((0, 512)));
        assert_eq!(p[3], Some((0, 1536)));
        assert_eq!(p[4], Some((1, 0)), "does not fit: the next block");
        assert_eq!(p[7], None, "as large as a block");
        assert_eq!(
            p[8],
            Some((2, 4608)),
            "the large one in between ends no block"
        );
        assert_eq!(places(&[100], 8192), vec![None]);
        assert_eq!(places(&[], 8192), vec![]);
    }

    #[test]
    fn pieces_join_only_within_a_block_in_file_and_memory_order() {
        let got = pieces([
            (0, 0, 10, 1000, Some(0)),
            (0, 10, 5, 1010, Some(0)), // follows: joined
            (0, 15, 0, 1015, None),    // empty: no piece, and ends the run
            (0, 15, 5, 1015, Some(0)), // after an empty tensor: a piece of its own
            (0, 20, 5, 2000, Some(0)), // a gap in memory
            (1, 25, 5, 2005, Some(0)), // another file
            (1, 30, 5, 2010, Some(1)), // another block
            (1, 35, 5, 2015, None),    // alone
            (1, 40, 5, 2020, None),    // alone, though it follows
        ]);
        assert_eq!(
            got,
            vec![
                (0, 0, 15, 1000),
                (0, 15, 5, 1015),
                (0, 20, 5, 2000),
                (1, 25, 5, 2005),
                (1, 30, 5, 2010),
                (1, 35, 5, 2015),
                (1, 40, 5, 2020),
            ]
        );
    }
}
