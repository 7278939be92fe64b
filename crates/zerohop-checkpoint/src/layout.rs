//! The save's layout step: which data file each region goes to, where in
//! it, and the fixed-size chunks each data file is checksummed by.

use crate::baseline::Baseline;
use crate::manifest::{chunk_checksum, Chunk, DataFile, Entry, Piece};
use crate::request::{Region, SaveOptions};
use crate::store::NewCheckpoint;
use std::sync::Mutex;
use zerohop::plan::TransferPlan;
use zerohop::safetensors::{layout, Dtype, TensorToSave};
use zerohop::storage::SinkFile;
use zerohop::{DeviceBuffer, Engine, Result};

/// The least a data file holds where the caller names no shard count:
/// small saves gain nothing from more files, and an object store copies
/// unchanged ranges of a file only past its first part (which holds the
/// header), so files of several parts keep incremental saves incremental.
const MIN_SHARE: u64 = 16 << 20;

/// A new checkpoint's data files, created and sized, and what goes where.
pub(crate) struct SaveLayout {
    /// The data files, open for writing.
    pub files: Vec<SinkFile>,
    /// Every region's bytes to their place in the data files.
    pub plan: TransferPlan,
    pub data_files: Vec<DataFile>,
    pub entries: Vec<Entry>,
    /// Per data file: each tensor's file offset and bytes, in file order.
    pub placed: Vec<Vec<(u64, DeviceBuffer)>>,
    /// Every chunk of every data file, in file order.
    pub slots: Vec<ChunkSlot>,
}

impl SaveLayout {
    /// Spreads `regions` over data files of `new`, creates them and writes
    /// their headers. A store may copy unchanged parts from the parent's
    /// file of the same name.
    pub fn new(
        engine: &Engine,
        regions: &[Region],
        new: &dyn NewCheckpoint,
        base: &Baseline,
        opts: &SaveOptions,
    ) -> Result<SaveLayout> {
        let total: u64 = regions.iter().map(|r| r.data.len() as u64).sum();
        let n = opts
            .shards
            .unwrap_or_else(|| {
                engine
                    .write_spread()
                    .min(total.div_ceil(MIN_SHARE) as usize)
            })
            .max(1);
        let pieces = split(regions, n, opts.chunk_bytes);
        // The caller's metadata is the manifest's; the data files name only
        // their format. A saved state's structure, copied into each of 16
        // headers, had a save of 3,280 tensors spend 16 - 27 ms laying out
        // its files, against 6 - 10 ms without (the H200 machine).
        let metadata = [("format".to_string(), "zerohop-checkpoint".to_string())].into();
        let mut files = Vec::new();
        let mut plan = TransferPlan::new();
        let mut data_files = Vec::new();
        let mut placed = Vec::new();
        // Per region, its pieces' places, by where each starts in it.
        let mut places: Vec<Vec<(u64, Piece)>> = vec![Vec::new(); regions.len()];
        for (s, members) in shard(&pieces, n.min(pieces.len())).into_iter().enumerate() {
            let tensors: Vec<TensorToSave> = members
                .iter()
                .map(|&i| pieces[i].to_save(regions))
                .collect::<Result<_>>()?;
            let layout = layout(&tensors, &metadata)?;
            let name = format!("data-{s:05}.safetensors");
            let file = new.create_data(&name, layout.file_len, base.name.as_deref())?;
            layout.start_file(engine, file, &tensors, &mut files, &mut plan)?;
            placed.push(
                tensors
                    .iter()
                    .zip(&layout.tensors)
                    .map(|(t, info)| (layout.data_start + info.begin, t.data.clone()))
                    .collect(),
            );
            for (&i, info) in members.iter().zip(&layout.tensors) {
                let piece = Piece {
                    file: s,
                    offset: layout.data_start + info.begin,
                    bytes: info.len(),
                };
                places[pieces[i].region].push((pieces[i].at, piece));
            }
            data_files.push(DataFile {
                name,
                bytes: layout.file_len,
                header_bytes: layout.data_start,
                header_xxh3: chunk_checksum(&layout.header),
            });
        }
        let entries = regions
            .iter()
            .zip(places)
            .map(|(r, mut places)| {
                places.sort_unstable_by_key(|(at, _)| *at);
                let pieces: Vec<Piece> = places.into_iter().map(|(_, p)| p).collect();
                Entry {
                    name: r.name.clone(),
                    dtype: r.tensor.as_ref().map(|(d, _)| d.name().to_string()),
                    shape: r.tensor.as_ref().map(|(_, s)| s.clone()),
                    bytes: r.data.len() as u64,
                    file: pieces[0].file,
                    offset: pieces[0].offset,
                    pieces: if pieces.len() > 1 { pieces } else { Vec::new() },
                }
            })
            .collect();
        let slots = chunk_slots(&data_files, opts.chunk_bytes);
        Ok(SaveLayout {
            files,
            plan,
            data_files,
            entries,
            placed,
            slots,
        })
    }

    /// Each chunk's bytes as slices of the tensors it overlaps, in order.
    pub fn chunk_pieces(&self) -> Result<Vec<Vec<DeviceBuffer>>> {
        let mut chunks = Vec::with_capacity(self.slots.len());
        for c in &self.slots {
            let tensors = &self.placed[c.file];
            let end = c.offset + c.len;
            // From the last tensor starting at or before the chunk, while
            // they start before its end.
            let first = tensors.partition_point(|(at, _)| *at <= c.offset).max(1) - 1;
            let mut pieces = Vec::new();
            for (at, data) in tensors[first..].iter().take_while(|(at, _)| *at < end) {
                let from = c.offset.max(*at);
                let to = end.min(at + data.len() as u64);
                if from < to {
                    pieces.push(data.slice((from - at) as usize, (to - from) as usize)?);
                }
            }
            debug_assert_eq!(
                pieces.iter().map(|p| p.len() as u64).sum::<u64>(),
                c.len,
                "a chunk's pieces must cover it"
            );
            chunks.push(pieces);
        }
        Ok(chunks)
    }
}

/// A region, or a piece of one that is split: `len` bytes from `at`.
struct RegionPiece {
    region: usize,
    at: u64,
    len: u64,
    /// Its number and the region's count of pieces (1 when whole).
    part: (usize, usize),
}

impl RegionPiece {
    /// What the data file holds: a whole region as itself; a piece as raw
    /// bytes, named after its region and place (`NAME#part3of16`).
    fn to_save(&self, regions: &[Region]) -> Result<TensorToSave> {
        let r = &regions[self.region];
        if self.part.1 == 1 {
            return Ok(r.to_save());
        }
        Ok(TensorToSave {
            name: format!("{}#part{}of{}", r.name, self.part.0 + 1, self.part.1),
            dtype: Dtype::U8,
            shape: vec![self.len],
            data: r.data.slice(self.at as usize, self.len as usize)?,
        })
    }
}

/// Cuts every region larger than an even share of `n` data files into
/// pieces of that share (a multiple of `chunk_bytes`), so that one large
/// region is written into many files at once, as many small ones are:
/// writers of one file wait for each other on some file systems (tmpfs
/// takes the file's lock for every write). Equal inputs give equal pieces,
/// which incremental saves rely on.
fn split(regions: &[Region], n: usize, chunk_bytes: u64) -> Vec<RegionPiece> {
    let total: u64 = regions.iter().map(|r| r.data.len() as u64).sum();
    let share = total
        .div_ceil(n as u64)
        .next_multiple_of(chunk_bytes)
        .max(chunk_bytes);
    let mut pieces = Vec::new();
    for (region, r) in regions.iter().enumerate() {
        let len = r.data.len() as u64;
        let count = len.div_ceil(share).max(1) as usize;
        for k in 0..count {
            let at = k as u64 * share;
            pieces.push(RegionPiece {
                region,
                at,
                len: share.min(len - at),
                part: (k, count),
            });
        }
    }
    pieces
}

/// Splits pieces over `n` shards, largest first onto the lightest shard,
/// keeping the callers' order inside each shard (so equal inputs give equal
/// layouts, which incremental saves rely on).
fn shard(pieces: &[RegionPiece], n: usize) -> Vec<Vec<usize>> {
    let n = n.max(1);
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(pieces[i].len));
    let mut load = vec![0u64; n];
    let mut shards = vec![Vec::new(); n];
    for i in order {
        let lightest = (0..n).min_by_key(|&s| (load[s], s)).expect("n >= 1");
        load[lightest] += pieces[i].len;
        shards[lightest].push(i);
    }
    for s in &mut shards {
        s.sort_unstable();
    }
    shards
}

/// One chunk's place, and what the save learned of it.
pub(crate) struct ChunkSlot {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
    /// Its checksum and the checkpoint holding its bytes (`None`: this
    /// one), once the write filter has seen it.
    pub seen: Mutex<Option<(String, Option<String>)>>,
}

impl ChunkSlot {
    pub fn chunk(&self, xxh3: String, stored_in: Option<String>) -> Chunk {
        Chunk {
            file: self.file,
            offset: self.offset,
            len: self.len,
            xxh3,
            stored_in,
        }
    }
}

/// Every chunk of every data file, in file order.
fn chunk_slots(files: &[DataFile], chunk_bytes: u64) -> Vec<ChunkSlot> {
    let mut out = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut at = f.header_bytes;
        while at < f.bytes {
            let end = ((at / chunk_bytes + 1) * chunk_bytes).min(f.bytes);
            out.push(ChunkSlot {
                file: i,
                offset: at,
                len: end - at,
                seen: Mutex::new(None),
            });
            at = end;
        }
    }
    out
}
