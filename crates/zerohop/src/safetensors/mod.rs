//! The safetensors format: a strict header parser (fuzzed), a loader that
//! streams shards into device memory through the engine, and a writer of
//! synthetic transformer-shaped models.

mod header;
mod load;
mod synth;

pub use header::{
    parse_header, read_header, serialize_header, Dtype, Header, TensorInfo, MAX_HEADER_BYTES,
};
pub use load::{load_safetensors, Allocation, LoadedModel, LoadedTensor};
pub use synth::{transformer_shapes, write_synthetic, SyntheticTensor};
