//! Synthetic transformer-shaped models for demos, tests and benchmarks.

use super::header::{serialize_header, Dtype, TensorInfo};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// One tensor of a synthetic model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticTensor {
    pub name: String,
    pub shape: Vec<u64>,
}

/// bf16 tensors shaped like a decoder-only transformer (embeddings,
/// attention and MLP projections, norms) adding up to about `target` bytes.
/// Hidden size scales with the target so small models still have several
/// layers; an 8 GiB target gives a 4096-wide model of ~20 layers and ~180
/// tensors.
pub fn transformer_shapes(target: u64) -> Vec<SyntheticTensor> {
    let bytes = |shape: &[u64]| shape.iter().product::<u64>() * 2;
    let mut hidden = 4096u64;
    // Shrink until embeddings plus four layers fit.
    loop {
        let layer = layer_shapes(0, hidden)
            .iter()
            .map(|t| bytes(&t.shape))
            .sum::<u64>();
        if hidden <= 64 || vocab(hidden) * hidden * 4 + 4 * layer <= target {
            break;
        }
        hidden /= 2;
    }
    let mut out = vec![SyntheticTensor {
        name: "model.embed_tokens.weight".into(),
        shape: vec![vocab(hidden), hidden],
    }];
    let mut total = bytes(&out[0].shape) * 2 + hidden * 2;
    let mut layer = 0;
    loop {
        let next = layer_shapes(layer, hidden);
        let add: u64 = next.iter().map(|t| bytes(&t.shape)).sum();
        if layer > 0 && total + add > target {
            break;
        }
        total += add;
        out.extend(next);
        layer += 1;
    }
    out.push(SyntheticTensor {
        name: "model.norm.weight".into(),
        shape: vec![hidden],
    });
    out.push(SyntheticTensor {
        name: "lm_head.weight".into(),
        shape: vec![vocab(hidden), hidden],
    });
    out
}

fn vocab(hidden: u64) -> u64 {
    (hidden * 8).min(32000)
}

fn layer_shapes(i: u64, h: u64) -> Vec<SyntheticTensor> {
    let inter = h * 11 / 4 / 64 * 64; // ~2.7x, as in LLaMA-style MLPs
    let p = |n: &str, shape: Vec<u64>| SyntheticTensor {
        name: format!("model.layers.{i}.{n}"),
        shape,
    };
    vec![
        p("input_layernorm.weight", vec![h]),
        p("self_attn.q_proj.weight", vec![h, h]),
        p("self_attn.k_proj.weight", vec![h, h]),
        p("self_attn.v_proj.weight", vec![h, h]),
        p("self_attn.o_proj.weight", vec![h, h]),
        p("post_attention_layernorm.weight", vec![h]),
        p("mlp.gate_proj.weight", vec![inter, h]),
        p("mlp.up_proj.weight", vec![inter, h]),
        p("mlp.down_proj.weight", vec![h, inter]),
    ]
}

/// Writes a synthetic model to `path` with random bf16 contents from
/// `seed`. Returns the file size. `progress` gets bytes written.
pub fn write_synthetic(
    path: &Path,
    target: u64,
    seed: u64,
    progress: Option<&dyn Fn(u64)>,
) -> Result<u64> {
    let shapes = transformer_shapes(target);
    let mut begin = 0;
    let tensors: Vec<TensorInfo> = shapes
        .into_iter()
        .map(|s| {
            let len = s.shape.iter().product::<u64>() * 2;
            let t = TensorInfo {
                name: s.name,
                dtype: Dtype::BF16,
                shape: s.shape,
                begin,
                end: begin + len,
            };
            begin += len;
            t
        })
        .collect();
    let meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("generator".to_string(), "zerohop gen".to_string()),
    ]);
    let header = serialize_header(&tensors, &meta, 8);
    let io = |e| Error::io(path, "cannot write", e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    out.write_all(&header).map_err(io)?;
    let mut rng = seed ^ 0x5851_F42D_4C95_7F2D;
    let mut chunk = vec![0u8; 4 << 20];
    let mut left = begin;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        fill_bf16(&mut chunk[..n], &mut rng);
        out.write_all(&chunk[..n]).map_err(io)?;
        left -= n as u64;
        if let Some(p) = progress {
            p(n as u64);
        }
    }
    out.flush().map_err(io)?;
    Ok(header.len() as u64 + begin)
}

/// Fills `buf` with random finite values of `dtype` from the splitmix64
/// stream `state` (as [`write_synthetic`] fills its tensors): the 8-bit
/// float types get random bytes with no NaN or infinity; every other type
/// gets the bf16 stream, which is finite bf16 pairwise and finite f32 (its
/// high half is a finite bf16). Callers that fill a stream piece by piece
/// get the same bytes as one call when every piece but the last is a
/// multiple of 8 bytes.
pub fn fill_random(dtype: Dtype, buf: &mut [u8], state: &mut u64) {
    use Dtype::*;
    match dtype {
        F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => fill_fp8(buf, state),
        _ => fill_bf16(buf, state),
    }
}

/// The next splitmix64 value.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random 8-bit floats: bit 6 (the top exponent bit in every fp8 format)
/// cleared, so no byte is a NaN or an infinity.
fn fill_fp8(buf: &mut [u8], state: &mut u64) {
    for word in buf.chunks_mut(8) {
        let b = (splitmix(state) & 0xBFBF_BFBF_BFBF_BFBF).to_le_bytes();
        word.copy_from_slice(&b[..word.len()]);
    }
}

/// Random finite bf16 values of magnitude 2^-8..2 (never NaN or infinity).
fn fill_bf16(buf: &mut [u8], state: &mut u64) {
    for word in buf.chunks_mut(8) {
        let z = splitmix(state);
        // Per 16-bit lane: keep sign and mantissa, force exponent 0x77..0x7F.
        let v = (z & 0x80FF_80FF_80FF_80FF)
            | 0x3B80_3B80_3B80_3B80
            | ((z >> 3) & 0x0400_0400_0400_0400);
        let b = v.to_le_bytes();
        word.copy_from_slice(&b[..word.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_gib_model_is_transformer_shaped() {
        let ts = transformer_shapes(8 << 30);
        let bytes: u64 = ts.iter().map(|t| t.shape.iter().product::<u64>() * 2).sum();
        assert!(ts.len() >= 170, "{} tensors", ts.len());
        assert!(bytes <= 8 << 30 && bytes > 7 << 30, "{bytes}");
        assert_eq!(ts[1].shape, vec![4096]);
    }

    #[test]
    fn small_targets_still_have_layers() {
        let ts = transformer_shapes(4 << 20);
        assert!(
            ts.iter()
                .filter(|t| t.name.ends_with("q_proj.weight"))
                .count()
                >= 1
        );
    }

    #[test]
    fn fp8_values_are_finite_and_bf16_is_the_default_stream() {
        let mut buf = vec![0u8; 4096];
        fill_random(Dtype::F8_E4M3, &mut buf, &mut 7);
        // E4M3's only NaNs are S.1111.111: never with bit 6 clear.
        assert!(buf.iter().all(|b| b & 0x40 == 0));
        assert!(buf.iter().any(|&b| b != 0));
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 100]);
        fill_random(Dtype::BF16, &mut a, &mut 3);
        fill_bf16(&mut b, &mut 3);
        assert_eq!(a, b);
    }

    #[test]
    fn values_are_finite_bf16() {
        let mut buf = vec![0u8; 4096];
        fill_bf16(&mut buf, &mut 7);
        for c in buf.chunks(2) {
            let exp = (u16::from_le_bytes([c[0], c[1]]) >> 7) & 0xFF;
            assert!(exp != 0xFF && exp != 0, "exponent {exp:#x}");
        }
    }
}
