//! Copies a recording made that another model or another shape gets as views, and what each
//! of them copied, read from the template's own events (the recorders did not write it).
//! Where no copy is made, what saved the copy saves the tensor it would have copied, alive until
//! the copy would have been freed: the planner replays that as it replays a dropout that returns
//! its input ([`TensorT::source`](super::TensorT::source)).
//!
//! - transformers' `repeat_kv`: a template recorded with grouped key-value heads (12 heads over
//!   4) holds its copies of the keys and values, one a query head, which the attention saves in
//!   place of the keys and values themselves (freed at the end of the attention). A model with
//!   as many key-value heads as heads gets the tensor itself, and one with a single key-value
//!   head a view (the expanded dimension merges with one of size 1). A copy is as wide as the
//!   query where what it copies is as wide as the keys (the unit `q` in its law is `kv` in
//!   theirs), made in the same layer and alive when the copy is made; the key's copy is made,
//!   then the value's, and each takes the latest such tensor not taken before it. The key and
//!   the value are the same size, so which of the two a copy names changes no byte.
//! - BLOOM's attention splits its fused query-key-value output into views and reshapes each to
//!   batch × heads (`reshape(batch_size * num_heads, ...)`): a copy at a batch of two or more
//!   (the batch's stride is not the heads' times their count), a view of the fused output at a
//!   batch of one, which then stays alive for the backward in their place. Such a copy is a
//!   third of the fused output's size, made by `aten::reshape` after it in the same layer and
//!   before the layer's attention scores (the reshape after them, of the attention's output, is
//!   a copy at any batch).
//! - eager attention's `torch.matmul` over a query, key or value that is a view of a fused
//!   query-key-value output (GPT-2's three; Phi-3's and GPT-NeoX's value, their query and key
//!   being rotated copies): it folds batch × heads into one dimension for `bmm`, a copy at a
//!   batch of two or more and a view at a batch of one, as BLOOM's reshape. Such a copy is a
//!   third of the fused output's size, made by `aten::matmul` (`aten::matmul > aten::empty`)
//!   while that output is alive in the same layer, before the scores (the query, the key) or
//!   after them (the value). A recording made with the key-value cache on copied the key and
//!   the value onto the cache (`aten::cat`), which `matmul` then views at any batch: there the
//!   query's fold alone is such a copy, and at a batch of one the step keeps the fused output
//!   and the cache's two copies.
//! - SDPA's math path folds its scaled query the same way where the query is laid out batch ×
//!   tokens × heads (rotated from a transposed view): a copy at a batch of two or more, a view
//!   of the scaled query at one ([`query_fold`]).

use super::{EventT, Kernel, LawKind, TensorT, UnitLaw};

/// `law` with the unit `q` (heads × head width) read as `kv` (key-value heads × head width).
fn as_keys(law: &UnitLaw) -> UnitLaw {
    UnitLaw(law.0.iter().map(|(kind, u, c)| (*kind, if u == "q" { "kv".to_string() } else { u.clone() }, *c)).collect())
}

/// Sets [`TensorT::source`] of every `repeat_kv` copy without one that `sections` show consuming
/// a tensor; a copy no such tensor explains keeps none (the planner replays it as before: gone
/// where no copy is made).
pub(super) fn repeat_kv_sources(tensors: &mut [TensorT], laws: &[UnitLaw], sections: &[&[EventT]]) {
    let mut taken = vec![false; tensors.len()];
    for section in sections {
        let mut live: Vec<&EventT> = Vec::new();
        for e in section.iter() {
            if e.free {
                if let Some(at) = live.iter().rposition(|l| l.tensor == e.tensor) {
                    live.remove(at);
                }
                continue;
            }
            let x = &tensors[e.tensor as usize];
            if x.kernel == Kernel::RepeatKv && x.source.is_none() {
                let wanted = as_keys(&laws[x.law_index]);
                let found = live.iter().rev().filter(|l| l.layer == e.layer).map(|l| l.tensor).find(|&s| {
                    let y = &tensors[s as usize];
                    !taken[s as usize] && y.kernel != Kernel::RepeatKv && laws[y.law_index] == wanted
                });
                if let Some(s) = found {
                    taken[s as usize] = true;
                    tensors[e.tensor as usize].source = Some(s);
                }
            }
            live.push(e);
        }
    }
}

/// The site of `torch.matmul`'s copy of an operand it cannot view as batch × heads.
const MATMUL_FOLD: &str = "aten::matmul > aten::empty";

/// Whether `whole` is three times `part`, term for term.
fn thrice(whole: &UnitLaw, part: &UnitLaw) -> bool {
    whole.0.len() == part.0.len()
        && !part.0.is_empty()
        && whole.0.iter().zip(&part.0).all(|((k, u, c), (k2, u2, c2))| k == k2 && u == u2 && *c == 3.0 * c2)
}

/// Marks [`TensorT::batch_view`] (with its source) each copy `sections` show folding a third of
/// a fused query-key-value output into batch × heads: BLOOM's reshapes before the layer's
/// scores, and eager attention's `matmul` folds (read by the planner for the families that fuse
/// the query, key and value); and SDPA's math path's fold of its scaled query ([`query_fold`],
/// read for every family).
pub(super) fn batch_view_sources(tensors: &mut [TensorT], laws: &[UnitLaw], sites: &[String], sections: &[&[EventT]]) {
    for section in sections {
        // The tensors alive, each with where it was made; per layer, where its latest scores
        // (a position pair's bytes) were made.
        let mut live: Vec<(&EventT, usize)> = Vec::new();
        let mut scores: Vec<(Option<super::Layer>, usize)> = Vec::new();
        for (at, e) in section.iter().enumerate() {
            if e.free {
                if let Some(i) = live.iter().rposition(|(l, _)| l.tensor == e.tensor) {
                    live.remove(i);
                }
                continue;
            }
            let x = &tensors[e.tensor as usize];
            let law = &laws[x.law_index];
            let site = sites.get(x.site as usize).map(String::as_str);
            let reshape = site.is_some_and(|s| s.starts_with("aten::reshape"));
            let fold = site == Some(MATMUL_FOLD);
            if (reshape || fold) && x.source.is_none() {
                let fused = live
                    .iter()
                    .rev()
                    .filter(|(l, _)| l.layer == e.layer)
                    .find(|(l, _)| thrice(&laws[tensors[l.tensor as usize].law_index], law));
                if let Some(&(f, made)) = fused {
                    let scored = scores.iter().any(|&(l, s)| l == e.layer && s > made);
                    if fold || !scored {
                        tensors[e.tensor as usize].source = Some(f.tensor);
                        tensors[e.tensor as usize].batch_view = true;
                    }
                }
            }
            if let Some(q) = query_fold(tensors, laws, sites, section, at, &live) {
                tensors[e.tensor as usize].source = Some(q);
                tensors[e.tensor as usize].batch_view = true;
            }
            if law.0.iter().any(|(k, _, _)| *k == LawKind::TokenPosition) {
                scores.retain(|&(l, _)| l != e.layer);
                scores.push((e.layer, at));
            }
            live.push((e, at));
        }
    }
}

/// Whether an allocation's law is the attention's scores (a position pair's bytes) made by
/// `bmm`.
fn is_scores(x: &TensorT, laws: &[UnitLaw], sites: &[String]) -> bool {
    sites.get(x.site as usize).is_some_and(|s| s == "aten::bmm")
        && laws[x.law_index].0.iter().any(|(k, _, _)| *k == LawKind::TokenPosition)
}

/// SDPA's math path's fold of the scaled query, as the QLoRA recorder names it (`aten::clone`):
/// the copy allocated at `section[at]` between the scaled key (`aten::mul`, the allocation
/// before it) and the scores (`aten::bmm`, the one after), as wide as both. The query, rotated
/// where it is still laid out batch × tokens × heads, is scaled into a tensor of that layout, which
/// `matmul` copies to fold batch × heads at a batch of two or more and views at one; the key,
/// transposed from `repeat_kv`'s contiguous copy, it views at any batch. Returns the scaled
/// query: the latest `aten::mul` as wide, made in the layer before the key's and alive.
fn query_fold(
    tensors: &[TensorT],
    laws: &[UnitLaw],
    sites: &[String],
    section: &[EventT],
    at: usize,
    live: &[(&EventT, usize)],
) -> Option<u32> {
    let e = &section[at];
    let x = &tensors[e.tensor as usize];
    let site = |t: &TensorT| sites.get(t.site as usize).map(String::as_str);
    if e.free || x.source.is_some() || x.kernel != Kernel::None || site(x) != Some("aten::clone") {
        return None;
    }
    let next = section[at + 1..].iter().find(|n| !n.free)?;
    let key = section[..at].iter().rev().find(|n| !n.free)?;
    if live.last().is_none_or(|(l, _)| l.tensor != key.tensor) {
        return None;
    }
    let same = |t: u32| tensors[t as usize].law_index == x.law_index && site(&tensors[t as usize]) == Some("aten::mul");
    if !is_scores(&tensors[next.tensor as usize], laws, sites) || key.layer != e.layer || !same(key.tensor) {
        return None;
    }
    live[..live.len() - 1].iter().rev().map(|(l, _)| l).find(|l| l.layer == e.layer && same(l.tensor)).map(|l| l.tensor)
}

#[cfg(test)]
mod tests {
    use super::super::{keys, template, Layer};
    use super::*;

    /// Each layer's events of a template's forward (its first `backward` events of `step`).
    fn forward_of(t: &super::super::Template, layer: Layer) -> Vec<EventT> {
        t.step[..t.backward[1]].iter().filter(|e| e.layer == Some(layer) && !e.free).copied().collect()
    }

    /// Gemma 3's QLoRA template (12 heads over 4, sliding layers 0 to 3, the last global): each
    /// sliding layer copies its key and its value once, each copy naming a distinct tensor as
    /// wide as the keys made in its layer; the global layer (SDPA's math path with
    /// `enable_gqa`, no mask) copies nothing.
    #[test]
    fn each_repeat_kv_copy_names_the_key_or_value_it_copied() {
        let parsed = template("gemma3_text/causal-lm/bf16/sdpa-math/full/qlora-all").expect("recorded");
        let t = &parsed.template;
        for n in 0..5u8 {
            let made = forward_of(t, Layer { stack: 0, n });
            let copies: Vec<&TensorT> =
                made.iter().map(|e| &t.tensors[e.tensor as usize]).filter(|x| x.kernel == Kernel::RepeatKv).collect();
            assert_eq!(copies.len(), if n < 4 { 2 } else { 0 }, "layer {n}");
            let sources: Vec<u32> = copies.iter().map(|x| x.source.expect("a source")).collect();
            assert!(sources.len() < 2 || sources[0] != sources[1], "layer {n}: one tensor for both");
            for (x, &s) in copies.iter().zip(&sources) {
                assert!(made.iter().any(|e| e.tensor == s), "layer {n}: its source is made in the layer");
                assert_eq!(parsed.laws[t.tensors[s as usize].law_index], as_keys(&parsed.laws[x.law_index]));
            }
        }
    }

    /// BLOOM's templates: each layer's forward reshapes the query, the key and the value of its
    /// fused query-key-value output to batch × heads, and a recording made with the key-value
    /// cache on (the config's default, before `measure.no_cache`) the query alone; no reshape
    /// after the scores (the attention's output) is read as one. A checkpointed layer's
    /// recomputation makes the same three, read as views where its sites name the reshape (some
    /// recordings name them by the backward's node alone: those copies are as large as the fused
    /// output they would view, and are left as they are).
    #[test]
    fn bloom_s_batch_views_are_the_query_key_and_value_of_the_fused_output() {
        // The QLoRA recorder names a reshape's copy `aten::clone` and runs without a cache:
        // it copies the query, the key and the value, three copies as large as the fused
        // output they would view at a batch of one, left as they are.
        let bloom: Vec<&str> = keys().filter(|k| k.starts_with("bloom/causal-lm/") && !k.contains("qlora")).collect();
        assert!(bloom.len() >= 11, "{bloom:?}");
        for key in bloom {
            let parsed = template(key).expect("listed");
            let t = &parsed.template;
            let middle = Layer { stack: 0, n: 2 };
            let forward = forward_of(t, middle).iter().filter(|e| t.tensors[e.tensor as usize].batch_view).count();
            let all = t.tensors.iter().filter(|x| x.batch_view && x.home == Some(middle)).count();
            // A recording made with the key-value cache copied the key and the value onto it
            // (`aten::cat` in the layer's forward), leaving the query alone to view.
            let cached = forward_of(t, middle)
                .iter()
                .any(|e| t.sites.get(t.tensors[e.tensor as usize].site as usize).is_some_and(|s| s == "aten::cat"));
            let expected = if key.contains("/ckpt") || !cached { 3 } else { 1 };
            assert_eq!(forward, expected, "{key}: the middle layer's forward's views");
            let recomputed = if key.contains("/ckpt") { [expected, 2 * expected] } else { [expected; 2] };
            assert!(recomputed.contains(&all), "{key}: the middle layer's views, {all}");
            for x in t.tensors.iter().filter(|x| x.batch_view) {
                let fused = &parsed.laws[t.tensors[x.source.expect("a source") as usize].law_index];
                assert!(thrice(fused, &parsed.laws[x.law_index]), "{key}");
            }
        }
    }

    /// GPT-2's eager attention: `matmul` folds the query, the key and the value, each a view of
    /// the fused `c_attn` output, into copies at the recording's batches; with the key-value
    /// cache on, the key and the value are the cache's contiguous copies, which it views, and the
    /// query's fold is the only copy. Each fold names the fused output as its source.
    #[test]
    fn gpt2_s_matmul_folds_are_thirds_of_the_fused_output() {
        for (key, folds) in [
            ("gpt2/causal-lm/bf16/eager/full/lora-qv", 3),
            ("gpt2/causal-lm/bf16/eager/full/cache/lora-qv", 1),
            ("gpt2/causal-lm/bf16/eager/full", 3),
            ("gpt2/causal-lm/bf16/eager/full/cache", 1),
        ] {
            let parsed = template(key).expect("recorded");
            let t = &parsed.template;
            let marked: Vec<&TensorT> = forward_of(t, Layer { stack: 0, n: 2 })
                .iter()
                .map(|e| &t.tensors[e.tensor as usize])
                .filter(|x| x.batch_view)
                .collect();
            assert_eq!(marked.len(), folds, "{key}");
            for x in marked {
                assert_eq!(t.sites[x.site as usize], MATMUL_FOLD, "{key}");
                let fused = &parsed.laws[t.tensors[x.source.expect("a source") as usize].law_index];
                assert!(thrice(fused, &parsed.laws[x.law_index]), "{key}");
            }
        }
    }

    /// Qwen3's QLoRA step on SDPA's math path (16 heads over 8 at the case's widths, 12 over 4
    /// recorded): in each layer's recomputed attention the query's fold, between the scaled key
    /// and the scores, names the scaled query, an `aten::mul` as wide made before the key's.
    #[test]
    fn the_math_path_s_query_fold_names_the_scaled_query() {
        let key = "qwen3/causal-lm/bf16/sdpa-math/ckpt/qlora-qv";
        let parsed = template(key).expect("recorded");
        let t = &parsed.template;
        let backward = &t.step[t.backward[1]..];
        for n in 0..5u8 {
            let layer = Some(Layer { stack: 0, n });
            let made: Vec<&EventT> = backward.iter().filter(|e| e.layer == layer && !e.free).collect();
            let folds: Vec<usize> =
                (0..made.len()).filter(|&i| t.tensors[made[i].tensor as usize].batch_view).collect();
            assert_eq!(folds.len(), 1, "layer {n}");
            let at = folds[0];
            let fold = &t.tensors[made[at].tensor as usize];
            let source = fold.source.expect("a source");
            let scaled_key = made[at - 1].tensor;
            assert!(made[..at - 1].iter().any(|e| e.tensor == source), "layer {n}: made before the key's");
            for s in [source, scaled_key] {
                assert_eq!(t.sites[t.tensors[s as usize].site as usize], "aten::mul", "layer {n}");
                assert_eq!(t.tensors[s as usize].law, fold.law, "layer {n}");
            }
            assert!(is_scores(&t.tensors[made[at + 1].tensor as usize], &parsed.laws, &t.sites), "layer {n}");
        }
    }
}
