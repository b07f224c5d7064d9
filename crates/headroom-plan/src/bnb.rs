//! bitsandbytes' quantized linear layers as transformers loads them (`BitsAndBytesConfig`
//! passed to `from_pretrained`): what each one stores on the GPU, and what its forward
//! allocates beside the layer's input and output.
//!
//! transformers replaces every `nn.Linear` (and GPT-2's `Conv1D`) of the blocks
//! (`replace_with_bnb_linear`) but the modules `get_keys_to_not_convert` names — the output
//! embeddings (`lm_head`), tied weights, the last module — and `llm_int8_skip_modules`.
//! Embeddings and norms are no linear layers and keep the load dtype; a mixture's experts,
//! which transformers keeps as fused 3-D parameters (`MixtralExperts.gate_up_proj`), too.
//!
//! - **LLM.int8()** (`load_in_8bit`, `Linear8bitLt`, `Int8Params`): the weight as int8 (`CB`)
//!   and one fp32 absmax a row (`SCB`). The forward (`MatMul8bitLt`, threshold
//!   `llm_int8_threshold` 6.0) quantizes the input row-wise to int8
//!   (`int8_vectorwise_quant`: the int8 copy, fp32 row scales, and `A.abs() >= threshold` —
//!   an fp16 copy and a bool mask — to find the outlier columns), multiplies in int8 into an
//!   int32 output (`int8_linear_matmul`), dequantizes that to fp16 (`int8_mm_dequant`), and
//!   adds the outlier columns back in fp16 (`int8_mixed_scaled_mm`: the inputs' outlier
//!   columns, the weight's columns dequantized to fp32 then fp16, and `addmm`'s new output).
//! - **4-bit** (`load_in_4bit`, `Linear4bit`, `Params4bit`): two weights a byte, one fp32
//!   absmax per block of 64 (`quantize_4bit`), or with double quantization
//!   (`bnb_4bit_use_double_quant`) one uint8 absmax a block and one fp32 absmax per 256 of
//!   those (`quantize_blockwise(absmax - offset, blocksize=256)`), and the data type's
//!   16-value code. The input is cast to `bnb_4bit_compute_dtype` (transformers' default:
//!   fp32); a forward over more than one token (a prefill) dequantizes the whole weight in
//!   its load dtype (`dequantize_4bit`), casts it to the compute dtype and multiplies
//!   (`MatMul4Bit`, bitsandbytes up to 0.49); one token at a time (decoding) goes through
//!   `gemv_4bit` with no copy. bitsandbytes 0.50's fused 4-bit GEMM (#1949) skips the
//!   dequantized copy under `no_grad`: the plan is then high by that copy.

use crate::model::Model;

/// `Params4bit`'s default block of weights per absmax.
pub const BLOCKSIZE: u64 = 64;
/// Double quantization's block of absmax values per second-level absmax.
pub const DOUBLE_QUANT_BLOCKSIZE: u64 = 256;
/// Entries of the 4-bit data type's code (`get_4bit_type`: fp32, one per linear layer).
const CODE_ENTRIES: u64 = 16;
/// Input columns LLM.int8() decomposes into fp16 at the default threshold of 6.0: the LLM.int8()
/// paper (Dettmers et al. 2022, §4) finds that from 6.7B parameters on the outliers of a
/// sequence concentrate in about 6 feature dimensions across the whole transformer.
pub const OUTLIER_COLUMNS: u64 = 6;

/// `bnb_4bit_quant_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    /// NormalFloat4: QLoRA's quantiles of a normal distribution.
    Nf4,
    /// A 4-bit float (transformers' default quant type).
    Fp4,
}

/// `bnb_4bit_compute_dtype`: the dtype a 4-bit layer casts its input and dequantized weight to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeDtype {
    /// transformers' default (`bnb_4bit_compute_dtype=None` becomes `torch.float32`).
    Fp32,
    Fp16,
    Bf16,
}

crate::names::named!(ComputeDtype {
    Fp32 => ("fp32", "transformers' default for bnb_4bit_compute_dtype"),
    Fp16 => ("fp16", ""),
    Bf16 => ("bf16", ""),
});

impl ComputeDtype {
    pub fn bytes(self) -> f64 {
        match self {
            ComputeDtype::Fp32 => 4.0,
            ComputeDtype::Fp16 | ComputeDtype::Bf16 => 2.0,
        }
    }
}

/// How bitsandbytes quantizes the linear layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bnb {
    /// LLM.int8() (`load_in_8bit=True`), outliers above 6.0 decomposed to fp16.
    Int8,
    /// `load_in_4bit=True`.
    FourBit { quant_type: QuantType, double_quant: bool, compute: ComputeDtype },
}

/// The (inputs, outputs) of the linear layers bitsandbytes quantizes in one block: every one,
/// but a mixture's experts (fused parameters, left in the load dtype).
pub fn quantized_linears(model: &Model) -> Vec<(u64, u64)> {
    let all = model.block_linears();
    if model.experts > 1 {
        all[..4].to_vec()
    } else {
        all
    }
}

impl Bnb {
    /// `BitsAndBytesConfig`'s names for this quantization: the format, with a 4-bit one's
    /// double quantization and compute dtype.
    pub fn describe(self) -> String {
        match self {
            Bnb::Int8 => "bitsandbytes int8 (LLM.int8())".to_string(),
            Bnb::FourBit { double_quant, compute, .. } => format!(
                "bitsandbytes {}{}, {} compute",
                self.format(),
                if double_quant { " with double quantization" } else { "" },
                crate::names::Named::name(compute)
            ),
        }
    }

    /// `int8`, `nf4` or `fp4`.
    pub fn format(self) -> &'static str {
        match self {
            Bnb::Int8 => "int8",
            Bnb::FourBit { quant_type: QuantType::Nf4, .. } => "nf4",
            Bnb::FourBit { quant_type: QuantType::Fp4, .. } => "fp4",
        }
    }

    /// Bytes one quantized linear layer of `k` inputs and `n` outputs keeps on the GPU (its
    /// weight and statistics; a bias stays in the load dtype and is counted with the rest).
    pub fn stored_bytes(self, k: u64, n: u64) -> f64 {
        let w = k.saturating_mul(n);
        match self {
            // CB (int8) and SCB (one fp32 absmax per output row).
            Bnb::Int8 => w as f64 + 4.0 * n as f64,
            Bnb::FourBit { double_quant, .. } => {
                let packed = w.div_ceil(2) as f64;
                let blocks = w.div_ceil(BLOCKSIZE);
                let absmax = if double_quant {
                    // uint8 absmax, fp32 second-level absmax, the fp32 offset, and the second
                    // level's 256-entry fp32 code, which `quantize_blockwise` copies into each
                    // layer's state (`code.to(A.device, copy=True)`, bitsandbytes 0.50).
                    blocks as f64 + 4.0 * blocks.div_ceil(DOUBLE_QUANT_BLOCKSIZE) as f64 + 4.0 + 4.0 * 256.0
                } else {
                    4.0 * blocks as f64
                };
                packed + absmax + 4.0 * CODE_ENTRIES as f64
            }
        }
    }

    /// Bytes of `model`'s weights: the quantized linear layers, the rest (embeddings, head,
    /// norms, biases, a mixture's experts) at `width` bytes a parameter (the load dtype).
    pub fn weight_bytes(self, model: &Model, width: f64) -> f64 {
        let linears = quantized_linears(model);
        let layers = model.layers as f64;
        let quantized: f64 = linears.iter().map(|&(k, n)| (k * n) as f64).sum::<f64>() * layers;
        let stored: f64 = linears.iter().map(|&(k, n)| self.stored_bytes(k, n)).sum::<f64>() * layers;
        (model.params() as f64 - quantized) * width + stored
    }

    /// The most one quantized linear layer's forward over `tokens` tokens allocates beside its
    /// input (`width` bytes an element, the activations' dtype) and the weights, in bytes,
    /// its output included: the largest of the layer's moments, over the block's layers.
    pub fn transient_bytes(self, model: &Model, tokens: f64, width: f64) -> f64 {
        quantized_linears(model)
            .iter()
            .map(|&(k, n)| self.linear_transient(k as f64, n as f64, tokens, width))
            .fold(0.0, f64::max)
    }

    fn linear_transient(self, k: f64, n: f64, t: f64, width: f64) -> f64 {
        match self {
            Bnb::Int8 => {
                // The input is cast to fp16 first where the activations are wider.
                let a16 = if width > 2.0 { 2.0 * t * k } else { 0.0 };
                let c = OUTLIER_COLUMNS.min(k as u64) as f64;
                // int8_vectorwise_quant: the int8 rows and fp32 row scales, with |A| (fp16)
                // and the outlier mask alive while the outlier columns are found.
                let quantize = t * k + 4.0 * t + 2.0 * t * k + t * k;
                // The outlier columns: the inputs' (fp16), the weight's (int8, then fp32
                // from int8_vectorwise_dequant, then fp16).
                let sub_a = 2.0 * t * c;
                let outliers = t * k + 4.0 * t + sub_a + n * c * (1.0 + 4.0);
                // int8_linear_matmul's int32 output dequantized to fp16 beside it; then
                // addmm's new fp16 output beside the old.
                let matmul = t * k + 4.0 * t + sub_a + 2.0 * n * c + 4.0 * t * n + 2.0 * t * n;
                let add = sub_a + 2.0 * n * c + 2.0 * t * n + 2.0 * t * n;
                a16 + quantize.max(outliers).max(matmul).max(add)
            }
            Bnb::FourBit { compute, .. } => {
                let wc = compute.bytes();
                // `x.to(compute_dtype)`: a copy where the dtypes differ.
                let x = if wc != width { wc * t * k } else { 0.0 };
                // One token at a time goes through gemv_4bit: no dequantized weight.
                if t <= 1.0 {
                    return x + wc * t * n + if wc != width { width * t * n } else { 0.0 };
                }
                // dequantize_4bit gives the weight in the load dtype; `.to(A.dtype)` copies it
                // to the compute dtype beside it where they differ.
                let loaded = width * k * n;
                let dequantize = if wc != width { loaded + wc * k * n } else { loaded };
                // F.linear's output in the compute dtype, then `.to(inp_dtype)` beside it.
                let out = wc * t * n + if wc != width { width * t * n } else { 0.0 };
                x + dequantize.max(wc * k * n + out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    const FP4: Bnb = Bnb::FourBit { quant_type: QuantType::Fp4, double_quant: false, compute: ComputeDtype::Fp32 };

    #[test]
    fn a_layer_stores_its_codes_and_statistics() {
        // 4096 × 4096: 8 MiB of int8 and 16 KiB of fp32 row scales (SCB).
        let n = 4096u64;
        assert_eq!(Bnb::Int8.stored_bytes(n, n), (n * n + 4 * n) as f64);
        // 4-bit: 8 MiB / 2 packed, 262,144 blocks of 64 with an fp32 absmax (0.5 bit a
        // weight), the 16-entry code.
        let blocks = n * n / 64;
        assert_eq!(FP4.stored_bytes(n, n), (n * n / 2 + 4 * blocks + 64) as f64);
        // Double quantization: a byte a block, and an fp32 absmax per 256 blocks (0.127 bit a
        // weight in all, QLoRA §3), with the layer's copy of the 256-entry fp32 code.
        let dq = Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: true, compute: ComputeDtype::Bf16 };
        let overhead = dq.stored_bytes(n, n) - (n * n / 2 + 64) as f64;
        assert_eq!(overhead, (blocks + 4 * blocks / 256 + 4 + 1024) as f64);
        assert!((overhead * 8.0 / (n * n) as f64 - 0.127).abs() < 0.001);
    }

    #[test]
    fn the_head_embeddings_and_experts_keep_the_load_dtype() {
        let m = preset("llama-2-7b").unwrap();
        let linear: u64 = m.block_linears().iter().map(|&(k, n)| k * n).sum::<u64>() * m.layers;
        let rest = (m.params() - linear) as f64;
        let int8 = Bnb::Int8.weight_bytes(&m, 2.0);
        let rows: u64 = m.block_linears().iter().map(|&(_, n)| n).sum::<u64>() * m.layers;
        assert_eq!(int8, 2.0 * rest + linear as f64 + 4.0 * rows as f64);
        // The embeddings and the untied head: 2 × 32000 × 4096 in 16 bits.
        assert!(rest >= 2.0 * 32000.0 * 4096.0);
        // Mixtral: only the attention projections are nn.Linear.
        let mx = preset("mixtral-8x7b").unwrap();
        assert_eq!(quantized_linears(&mx).len(), 4);
        assert!(Bnb::Int8.weight_bytes(&mx, 2.0) > 0.9 * 2.0 * mx.params() as f64);
    }

    #[test]
    fn each_term_of_a_forward_counts() {
        let m = preset("llama-2-7b").unwrap();
        let (k, n, t) = (4096.0, 11008.0, 512.0);
        // The dequantized weight: in the load dtype, then the fp32 copy beside it.
        let fp4 = FP4.linear_transient(k, n, t, 2.0);
        assert!(fp4 >= 4.0 * t * k + 6.0 * k * n);
        let bf16 = Bnb::FourBit { quant_type: QuantType::Nf4, double_quant: false, compute: ComputeDtype::Bf16 };
        assert_eq!(bf16.linear_transient(k, n, t, 2.0), (2.0 * k * n).max(2.0 * k * n + 2.0 * t * n));
        // Decoding (one token) dequantizes nothing.
        assert!(bf16.linear_transient(k, n, 1.0, 2.0) < 2.0 * n + 1.0);
        // LLM.int8(): the int32 product beside its fp16 dequantization, the outlier columns.
        let int8 = Bnb::Int8.linear_transient(k, n, t, 2.0);
        let c = OUTLIER_COLUMNS as f64;
        assert_eq!(int8, t * k + 4.0 * t + 2.0 * t * c + 2.0 * n * c + 6.0 * t * n);
        // The block's largest layer decides.
        assert_eq!(Bnb::Int8.transient_bytes(&m, t, 2.0), int8.max(Bnb::Int8.linear_transient(n, k, t, 2.0)));
    }
}
