//! What `zerohop gen` writes: the tensors of a synthetic model (names,
//! dtypes, shapes, in file order) and how they are split into shards.

use zerohop::safetensors::{transformer_shapes, Dtype, SyntheticTensor};

/// Element type of the weight matrices.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenDtype {
    Bf16,
    /// F8_E4M3 matrices, each with an F32 scale.
    Fp8,
}

/// One tensor to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl Planned {
    pub fn bytes(&self) -> u64 {
        self.dtype
            .byte_len(&self.shape)
            .expect("synthetic shapes are small enough")
    }
}

/// The tensors of a model of about `target` bytes, in file order.
///
/// Dense (the default): the transformer of
/// [`transformer_shapes`]. Small tensors: an MoE-style model whose every
/// matrix is 1 - 4 MiB. With fp8, each weight matrix inside the layers is
/// F8_E4M3 and followed by its F32 `weight_scale` of shape [1], as FP8
/// checkpoints store them; embeddings, norms and lm_head stay bf16.
pub fn plan(target: u64, dtype: GenDtype, small_tensors: bool) -> Vec<Planned> {
    let matrix = match dtype {
        GenDtype::Bf16 => Dtype::BF16,
        GenDtype::Fp8 => Dtype::F8_E4M3,
    };
    let shapes = if small_tensors {
        moe_shapes(target, matrix)
    } else if matrix == Dtype::BF16 {
        transformer_shapes(target)
    } else {
        dense_fp8_shapes(target)
    };
    let mut out = Vec::with_capacity(shapes.len());
    for s in shapes {
        let fp8 = matrix != Dtype::BF16 && is_layer_matrix(&s);
        out.push(Planned {
            dtype: if fp8 { matrix } else { Dtype::BF16 },
            shape: s.shape,
            name: s.name,
        });
        if fp8 {
            let name = format!("{}_scale", out.last().expect("just pushed").name);
            out.push(Planned {
                name,
                dtype: Dtype::F32,
                shape: vec![1],
            });
        }
    }
    out
}

/// A 2-D weight inside a layer (not the embeddings or lm_head).
fn is_layer_matrix(t: &SyntheticTensor) -> bool {
    t.shape.len() == 2 && t.name.starts_with("model.layers.")
}

/// The dense transformer with 1-byte layer matrices: whole layers of a
/// model twice the size, as many as fit in `target` with the bf16
/// embeddings, final norm and lm_head.
fn dense_fp8_shapes(target: u64) -> Vec<SyntheticTensor> {
    let all = transformer_shapes(target.saturating_mul(2));
    let bytes = |t: &SyntheticTensor| {
        let per = if is_layer_matrix(t) { 1 } else { 2 };
        t.shape.iter().product::<u64>() * per
    };
    let layer_of = |t: &SyntheticTensor| {
        t.name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .map(str::to_string)
    };
    let (layers, outside): (Vec<_>, Vec<_>) = all.into_iter().partition(|t| layer_of(t).is_some());
    // `outside` is the embeddings, then the final norm and lm_head.
    let mut total: u64 = outside.iter().map(bytes).sum();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let id = layer_of(&layers[i]);
        let end = (i..layers.len())
            .find(|&j| layer_of(&layers[j]) != id)
            .unwrap_or(layers.len());
        let add: u64 = layers[i..end].iter().map(bytes).sum();
        if !kept.is_empty() && total + add > target {
            break;
        }
        total += add;
        kept.extend_from_slice(&layers[i..end]);
        i = end;
    }
    let mut outside = outside.into_iter();
    let mut out: Vec<_> = outside.next().into_iter().collect();
    out.extend(kept);
    out.extend(outside);
    out
}

/// Smallest and largest expert width, and the step between widths.
const EXPERT_WIDTHS: (u64, u64, u64) = (512, 2048, 256);
/// Experts per layer.
const EXPERTS: u64 = 16;

/// An MoE-style model of many small tensors: per layer four attention
/// projections [w, w] and `EXPERTS` experts of gate, up and down
/// projections, [i, w] and [w, i], with `i` cycling through 512 - 2048.
/// `w` is 1024 bf16 elements (2048 for 1-byte types), so every matrix is
/// 1 - 4 MiB; no embeddings or norms. 8 GiB gives ~3,300 tensors.
fn moe_shapes(target: u64, dtype: Dtype) -> Vec<SyntheticTensor> {
    let w = 2048 * 8 / dtype.bits();
    let (lo, hi, step) = EXPERT_WIDTHS;
    let widths: Vec<u64> = (lo..=hi).step_by(step as usize).collect();
    let mut out = Vec::new();
    let (mut total, mut layer, mut k) = (0u64, 0u64, 0usize);
    loop {
        let t = |n: String, shape: Vec<u64>| SyntheticTensor {
            name: format!("model.layers.{layer}.{n}"),
            shape,
        };
        let mut next: Vec<SyntheticTensor> = ["q", "k", "v", "o"]
            .iter()
            .map(|p| t(format!("self_attn.{p}_proj.weight"), vec![w, w]))
            .collect();
        for e in 0..EXPERTS {
            let i = widths[k % widths.len()];
            k += 1;
            let m = |p: &str| format!("mlp.experts.{e}.{p}_proj.weight");
            next.push(t(m("gate"), vec![i, w]));
            next.push(t(m("up"), vec![i, w]));
            next.push(t(m("down"), vec![w, i]));
        }
        let add: u64 = next
            .iter()
            .map(|s| s.shape.iter().product::<u64>() * dtype.bits() / 8)
            .sum();
        if layer > 0 && total + add > target {
            return out;
        }
        total += add;
        out.extend(next);
        layer += 1;
    }
}

/// Splits `tensors` (in file order) into `shards` contiguous groups of
/// about equal bytes: each tensor goes to the shard its first byte falls
/// in. Errors when a shard would be empty.
pub fn split(tensors: Vec<Planned>, shards: usize) -> Result<Vec<Vec<Planned>>, String> {
    if shards == 0 {
        return Err("--shards must be at least 1".into());
    }
    let total: u64 = tensors.iter().map(Planned::bytes).sum();
    let count = tensors.len();
    let mut out: Vec<Vec<Planned>> = vec![Vec::new(); shards];
    let mut at = 0u64;
    for t in tensors {
        let k = (at as u128 * shards as u128 / total.max(1) as u128) as usize;
        at += t.bytes();
        out[k.min(shards - 1)].push(t);
    }
    if out.iter().any(Vec::is_empty) {
        return Err(format!(
            "cannot split {count} tensors into {shards} shards without an empty one: \
             ask for fewer shards or a larger --size"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn bytes(ts: &[Planned]) -> u64 {
        ts.iter().map(Planned::bytes).sum()
    }

    #[test]
    fn the_default_is_the_transformer_in_bf16() {
        let ts = plan(64 * MIB, GenDtype::Bf16, false);
        let reference = transformer_shapes(64 * MIB);
        assert_eq!(ts.len(), reference.len());
        for (t, r) in ts.iter().zip(&reference) {
            assert_eq!(
                (&t.name, &t.shape, t.dtype),
                (&r.name, &r.shape, Dtype::BF16)
            );
        }
    }

    #[test]
    fn small_tensors_are_all_1_to_4_mib_and_number_3000_plus_at_8_gib() {
        let ts = plan(8 * GIB, GenDtype::Bf16, true);
        assert!(ts.len() >= 3000, "{} tensors", ts.len());
        assert!(ts.iter().all(|t| (MIB..=4 * MIB).contains(&t.bytes())));
        let total = bytes(&ts);
        assert!(total <= 8 * GIB && total > 7 * GIB, "{total}");
        // fp8 doubles the width: the matrices stay 1 - 4 MiB.
        let fp8 = plan(GIB, GenDtype::Fp8, true);
        let matrices = fp8.iter().filter(|t| t.dtype == Dtype::F8_E4M3);
        assert!(matrices.clone().count() > 300);
        assert!(matrices
            .into_iter()
            .all(|t| (MIB..=4 * MIB).contains(&t.bytes())));
    }

    #[test]
    fn fp8_matrices_carry_an_f32_scale_and_the_rest_stays_bf16() {
        let ts = plan(8 * GIB, GenDtype::Fp8, false);
        let total = bytes(&ts);
        assert!(total <= 8 * GIB && total > 7 * GIB, "{total}");
        let fp8: Vec<_> = ts.iter().filter(|t| t.dtype == Dtype::F8_E4M3).collect();
        assert!(fp8.len() >= 200, "{}", fp8.len());
        for (i, t) in ts.iter().enumerate() {
            match t.dtype {
                Dtype::F8_E4M3 => {
                    let scale = &ts[i + 1];
                    assert_eq!(scale.name, format!("{}_scale", t.name));
                    assert_eq!(
                        (scale.dtype, scale.shape.as_slice()),
                        (Dtype::F32, &[1u64][..])
                    );
                }
                Dtype::F32 => assert!(t.name.ends_with("weight_scale")),
                d => assert_eq!(d, Dtype::BF16, "{}", t.name),
            }
        }
        assert_eq!(ts[0].name, "model.embed_tokens.weight");
        assert_eq!(ts.last().unwrap().name, "lm_head.weight");
        assert_eq!(ts.last().unwrap().dtype, Dtype::BF16);
        // A small model still has a layer.
        assert!(plan(4 * MIB, GenDtype::Fp8, false)
            .iter()
            .any(|t| t.dtype == Dtype::F8_E4M3));
    }

    #[test]
    fn shards_split_in_order_and_about_evenly() {
        let ts = plan(8 * GIB, GenDtype::Bf16, false);
        let names: Vec<_> = ts.iter().map(|t| t.name.clone()).collect();
        let total = bytes(&ts);
        let shards = split(ts, 4).unwrap();
        assert_eq!(shards.len(), 4);
        let joined: Vec<_> = shards.iter().flatten().map(|t| t.name.clone()).collect();
        assert_eq!(joined, names);
        for s in &shards {
            let b = bytes(s) as f64 / (total as f64 / 4.0);
            assert!((0.85..1.15).contains(&b), "shard of {b:.2} x a quarter");
        }
        assert_eq!(
            split(plan(8 * GIB, GenDtype::Bf16, false), 1)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn impossible_splits_are_errors() {
        let ts = plan(MIB, GenDtype::Bf16, false);
        let n = ts.len();
        assert!(split(ts.clone(), 0).unwrap_err().contains("at least 1"));
        assert!(split(ts, n + 1).unwrap_err().contains("empty"));
    }
}
