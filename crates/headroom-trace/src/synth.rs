//! Synthetic traces with the shape of real workloads, for the bundled example:
//! a GPT-style training loop (weights, per-layer activations saved for
//! backward, temporaries, gradients, Adam state, an input batch copied on a
//! side stream and used on the compute stream).

use crate::jsonl::TraceOp;

/// Shape of a decoder-only transformer training run, fp32 with AdamW.
#[derive(Clone, Copy, Debug)]
pub struct TrainingLoop {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub seq: u64,
    pub batch: u64,
    pub vocab: u64,
    pub steps: u64,
}

impl TrainingLoop {
    /// GPT-2 small (124 M parameters) at batch 4, sequence 512: the bundled example.
    pub fn gpt2_small() -> Self {
        TrainingLoop { layers: 12, hidden: 768, heads: 12, seq: 512, batch: 4, vocab: 50257, steps: 3 }
    }

    /// The operations of `steps` training steps.
    pub fn ops(&self) -> Vec<TraceOp> {
        let mut g = Gen::default();
        let (h, bs) = (self.hidden, self.batch * self.seq);
        let f32s = |n: u64| n * 4;
        // Parameters: embeddings, then per layer LN, QKV, proj, LN, MLP.
        let mut params = vec![("wte".to_string(), f32s(self.vocab * h)), ("wpe".to_string(), f32s(1024 * h))];
        for l in 0..self.layers {
            for (name, n) in [
                ("ln1", 2 * h),
                ("qkv.w", 3 * h * h),
                ("qkv.b", 3 * h),
                ("proj.w", h * h),
                ("proj.b", h),
                ("ln2", 2 * h),
                ("fc.w", 4 * h * h),
                ("fc.b", 4 * h),
                ("fc2.w", 4 * h * h),
                ("fc2.b", h),
            ] {
                params.push((format!("l{l}.{name}"), f32s(n)));
            }
        }
        params.push(("ln_f".to_string(), f32s(2 * h)));
        for (name, size) in &params {
            g.alloc(&format!("param.{name}"), *size, 0);
        }
        let act = f32s(bs * h);
        let scores = f32s(self.batch * self.heads * self.seq * self.seq);
        for step in 0..self.steps {
            let s = |name: &str| format!("s{step}.{name}");
            // The batch arrives on the copy stream and is used on the compute stream.
            g.alloc(&s("input"), bs * 8, 1);
            g.ops.push(TraceOp::RecordStream { id: s("input"), stream: 0 });
            g.alloc(&s("x"), act, 0);
            for l in 0..self.layers {
                let a = |name: &str| s(&format!("l{l}.{name}"));
                for (name, size) in [
                    ("ln1", act),
                    ("qkv", 3 * act),
                    ("scores", scores),
                    ("probs", scores),
                    ("attn", act),
                    ("proj", act),
                    ("ln2", act),
                    ("fc", 4 * act),
                    ("gelu", 4 * act),
                    ("fc2", act),
                ] {
                    g.alloc(&a(name), size, 0);
                }
                // Raw scores are not needed for backward; the softmax output is.
                g.free(&a("scores"));
            }
            g.alloc(&s("logits"), f32s(bs * self.vocab), 0);
            g.alloc(&s("loss"), 4, 0);
            g.alloc(&s("dlogits"), f32s(bs * self.vocab), 0);
            g.free(&s("loss"));
            g.free(&s("logits"));
            g.alloc(&s("dx"), act, 0);
            g.free(&s("dlogits"));
            for l in (0..self.layers).rev() {
                let a = |name: &str| s(&format!("l{l}.{name}"));
                for (name, _) in params.iter().filter(|(n, _)| n.starts_with(&format!("l{l}."))) {
                    if step == 0 {
                        let size = params.iter().find(|(n, _)| n == name).map(|p| p.1).unwrap_or(0);
                        g.alloc(&format!("grad.{name}"), size, 0);
                    }
                }
                for name in ["fc2", "gelu", "fc", "ln2", "proj", "attn", "probs", "qkv", "ln1"] {
                    let size = if matches!(name, "gelu" | "fc") {
                        4 * act
                    } else if name == "probs" {
                        scores
                    } else if name == "qkv" {
                        3 * act
                    } else {
                        act
                    };
                    // The gradient of each saved tensor, then the tensor itself, go.
                    g.alloc(&a(&format!("d{name}")), size, 0);
                    g.free(&a(name));
                    g.free(&a(&format!("d{name}")));
                }
            }
            if step == 0 {
                for name in ["wte", "wpe", "ln_f"] {
                    let size = params.iter().find(|(n, _)| n == name).map(|p| p.1).unwrap_or(0);
                    g.alloc(&format!("grad.{name}"), size, 0);
                }
            }
            g.free(&s("dx"));
            g.free(&s("x"));
            // AdamW: moment buffers on the first step, one temporary per parameter.
            for (name, size) in &params {
                if step == 0 {
                    g.alloc(&format!("adam.m.{name}"), *size, 0);
                    g.alloc(&format!("adam.v.{name}"), *size, 0);
                }
                g.alloc(&s(&format!("upd.{name}")), *size, 0);
                g.free(&s(&format!("upd.{name}")));
            }
            g.free(&s("input"));
            g.ops.push(TraceOp::CompleteEvents);
        }
        g.ops
    }
}

#[derive(Default)]
struct Gen {
    ops: Vec<TraceOp>,
}

impl Gen {
    fn alloc(&mut self, id: &str, size: u64, stream: u64) {
        self.ops.push(TraceOp::Alloc { id: id.to_string(), size, stream });
    }
    fn free(&mut self, id: &str) {
        self.ops.push(TraceOp::Free { id: id.to_string() });
    }
}
