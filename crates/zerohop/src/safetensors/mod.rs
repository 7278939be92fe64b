//! The safetensors format: a strict header parser (fuzzed), a loader that
//! streams shards into device memory through the engine, a writer that
//! saves device memory durably, and a writer of synthetic
//! transformer-shaped models.

mod header;
mod load;
mod save;
mod synth;

pub use header::{
    parse_header, read_header, serialize_header, Dtype, Header, TensorInfo, MAX_HEADER_BYTES,
};
pub use load::{load_safetensors, load_safetensors_sources, Allocation, LoadedModel, LoadedTensor};
pub use save::{layout, save_safetensors, FileLayout, TensorToSave};
pub use synth::{fill_random, transformer_shapes, write_synthetic, SyntheticTensor};
