//! CUDA's backward of the token embedding (`embedding_dense_backward_cuda`, PyTorch's
//! `aten/src/ATen/native/cuda/Embedding.cu`). Over more than 3,072 indices it sorts them and
//! sums each index's rows by partial segments (`embedding_backward_cuda_kernel`,
//! `EmbeddingBackwardKernel.cu`): once it has made the weight's gradient it makes
//! `grad_weight_per_segment`, a row of the embedding's width for each partial segment the
//! indices may need — `numel / NROWS_PER_THREAD + min(numel, num_weights)`, ten rows a partial
//! segment — in fp32 (a 16-bit gradient's accumulation type, an fp32 gradient's own), and frees
//! it as it returns. Up to 3,072 indices it runs `embedding_backward_feature_kernel` into the
//! gradient alone. The CPU's recording holds none. On an H200 (torch 2.11) Llama-1B at 4 × 2048
//! made one block of 73,818,112 B a step, (819 + 8,192) rows × 2,048 × 4 B (docs/VALIDATION.md,
//! "Llama-1B's checkpointed reserved rows, segment by segment").

use crate::model::Model;
use crate::program::{Law, Program, Term};

/// The most indices `embedding_dense_backward_cuda` sums with its feature kernel.
const FEATURE_KERNEL_MAX: u64 = 3072;
/// Rows a partial segment sums (`NROWS_PER_THREAD`).
const ROWS_PER_PARTIAL_SEGMENT: u64 = 10;

/// The bytes of `grad_weight_per_segment` for `indices` token ids of `model`'s embedding, or
/// none where the feature kernel runs.
pub(super) fn per_segment_bytes(model: &Model, indices: u64) -> Option<u64> {
    (indices > FEATURE_KERNEL_MAX)
        .then(|| (indices / ROWS_PER_PARTIAL_SEGMENT + indices.min(model.vocab)) * model.hidden * 4)
}

/// Whether a recorded tensor at `site` is made by an embedding's backward (autograd's node).
pub(super) fn made_by(site: &str) -> bool {
    site.contains("EmbeddingBackward0")
}

/// The partial segments' sums, made after the embedding's gradient and freed at once.
pub(super) fn per_segment_sums(p: &mut Program, model: &Model, indices: u64) {
    if let Some(bytes) = per_segment_bytes(model, indices) {
        let site = p.site("embedding_dense_backward: grad_weight_per_segment");
        let id = p.alloc(Law::fixed(bytes as f64), Term::Temporary, site);
        p.free(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dev grid's Llama-1B (`../shared/gpu/devgrid-cases.json`'s config).
    fn llama_1b() -> Model {
        let config = r#"{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
            "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": true}"#;
        Model::from_hf_config(config, "llama-1b").expect("a llama config")
    }

    #[test]
    fn llama_1b_at_4_by_2048_makes_the_h200s_block_and_512_tokens_none() {
        let m = llama_1b();
        assert_eq!((m.hidden, m.vocab), (2048, 128_256));
        assert_eq!(per_segment_bytes(&m, 4 * 2048), Some(73_818_112));
        assert_eq!(per_segment_bytes(&m, 3072), None);
        assert_eq!(per_segment_bytes(&m, 512), None);
    }
}
