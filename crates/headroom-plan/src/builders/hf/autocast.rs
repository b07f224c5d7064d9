//! What CUDA's autocast does otherwise than the CPU's the templates were recorded under.
//!
//! CUDA's autocast runs `pow` in fp32; the CPU's autocast, which the templates were
//! recorded under, leaves it in bf16 (`pow` is on CUDA's fp32 list, not on the CPU's).
//! transformers' tanh GELU (`NewGELUActivation`, `gelu_new`: GPT-2's MLP),
//! `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·pow(x, 3))))` of the bf16 output `x` of `c_fc`, then
//! runs in fp32 from the `pow` on: autocast copies `x` to fp32 for the `pow` (kept for its
//! backward in `x`'s place), every product and sum after it is promoted to fp32, the
//! `tanh` and `1 + tanh` kept for the backward take 4 bytes an element, and `c_proj` keeps
//! a bf16 copy of the fp32 result it is given. A layer keeps 16 bytes per token per MLP unit
//! where the recording kept 10 (the fp32 copy of `x`, `tanh` and `1 + tanh` at 4, `0.5·x` and
//! `c_proj`'s copy at 2; against `x`, `0.5·x`, `tanh`, `1 + tanh` and the product at 2): GPT-2
//! medium (4,096 units) at 4 × 2048 tokens, 4.5 GiB more over its 24 layers.
//! The backward runs the chain's gradients in fp32 too, with the casts to each bf16 input's
//! dtype autograd makes. Seen on an H200 with torch 2.11 (`../shared/gpu/snapshots/
//! native-gpt2-medium-b8`: at 8 × 888 tokens a layer's `c_fc` output is 58,195,968 bytes and
//! its GELU keeps three fp32 tensors of 116,391,936 beside the bf16 `0.5·x` and `c_proj`'s
//! bf16 input). Llama's `pow` (RMSNorm's) takes an fp32 input on both devices: no change.

use crate::program::Law;
use crate::program_template::{EventT, Kernel, Template};
use std::collections::{HashMap, HashSet};

/// Rewrites the template's steps with their tanh GELUs in fp32 (see the module's
/// documentation).
pub(super) fn fp32_pow(t: &mut Template) {
    let mut scaled = HashSet::new();
    if let Some(step1) = t.step1.take() {
        let (events, bw) = gelu_fp32(t, step1, t.backward[0], &mut scaled);
        t.step1 = Some(events);
        t.backward[0] = bw;
    }
    let step = std::mem::take(&mut t.step);
    let (events, bw) = gelu_fp32(t, step, t.backward[1], &mut scaled);
    t.step = events;
    t.backward[1] = bw;
    if t.step1.is_none() {
        // The first step is the later one's events (read only where `step1` is recorded).
        t.backward[0] = bw;
    }
    for id in scaled {
        let x = &mut t.tensors[id as usize];
        x.law = x.law.scaled(2.0);
    }
}

/// The op a site names: its last part (`… > aten::mul` is `aten::mul`).
pub(super) fn op(t: &Template, x: u32) -> &str {
    let site = t.sites.get(t.tensors[x as usize].site as usize).map(String::as_str).unwrap_or("");
    site.rsplit(" > ").next().unwrap_or(site)
}

fn site_has(t: &Template, x: u32, what: &str) -> bool {
    t.sites.get(t.tensors[x as usize].site as usize).is_some_and(|s| s.contains(what))
}

/// A new tensor like `like`, with `law` and a site of its own.
fn new_tensor(t: &mut Template, like: u32, law: Law, site: &str) -> u32 {
    let s = match t.sites.iter().position(|x| x == site) {
        Some(s) => s as u32,
        None => {
            t.sites.push(site.to_string());
            (t.sites.len() - 1) as u32
        }
    };
    let mut x = t.tensors[like as usize].clone();
    x.law = law;
    x.site = s;
    x.kernel = Kernel::None;
    x.mask = None;
    x.param = None;
    x.grad = None;
    t.tensors.push(x);
    (t.tensors.len() - 1) as u32
}

fn alloc(tensor: u32, layer: Option<crate::program_template::Layer>) -> EventT {
    EventT { free: false, tensor, layer, previous: false }
}

fn free(tensor: u32, layer: Option<crate::program_template::Layer>) -> EventT {
    EventT { free: true, tensor, layer, previous: false }
}

/// The events to add before or after, and in place of, a section's events.
#[derive(Default)]
struct Edits {
    before: HashMap<usize, Vec<EventT>>,
    after: HashMap<usize, Vec<EventT>>,
    replace: HashMap<usize, EventT>,
}

impl Edits {
    /// The section with the edits made, and where its backward now begins.
    fn apply(mut self, ev: &[EventT], backward: usize) -> (Vec<EventT>, usize) {
        let mut out = Vec::with_capacity(ev.len() + 16 * self.before.len().max(self.after.len()));
        let mut bw = backward;
        for (i, e) in ev.iter().enumerate() {
            if i == backward {
                bw = out.len();
            }
            out.extend(self.before.remove(&i).unwrap_or_default());
            out.push(self.replace.remove(&i).unwrap_or(*e));
            out.extend(self.after.remove(&i).unwrap_or_default());
        }
        if backward >= ev.len() {
            bw = out.len();
        }
        (out, bw)
    }
}

/// One GELU of a section, as the recording made it: where `x` (the matrix multiply's bf16
/// output), the chain of its law from the `pow` on, and `c_proj`'s weight cast and output are.
struct Gelu {
    /// The events of `x`, `0.5·x` and the `pow`.
    ia: usize,
    im: usize,
    ip: usize,
    /// The chain's events, the GELU's result last.
    chain: Vec<usize>,
    /// `c_proj`'s weight cast and output.
    iw: usize,
    io: usize,
    law: Law,
    layer: Option<crate::program_template::Layer>,
}

/// One section with its tanh GELUs in fp32: the events, and where its backward now begins.
fn gelu_fp32(t: &mut Template, ev: Vec<EventT>, backward: usize, scaled: &mut HashSet<u32>) -> (Vec<EventT>, usize) {
    let mut edits = Edits::default();
    let allocs: Vec<usize> = (0..ev.len()).filter(|&i| !ev[i].free).collect();
    for k in 0..allocs.len() {
        let Some(g) = find_gelu(t, &ev, &allocs, k) else { continue };
        let held = forward(t, &ev, &allocs, &g, &mut edits, scaled);
        if let Some(fg) = held {
            backward_fp32(t, &ev, &allocs, &g, fg, &mut edits, scaled);
        }
    }
    edits.apply(&ev, backward)
}

/// The first event of the chain after `x` and `0.5·x`, where the `k`-th allocation is a
/// GELU's `pow`: three allocations in a row of one law, in one layer, a `tanh` among those of
/// its law that follow, and `c_proj` after them.
fn find_gelu(t: &Template, ev: &[EventT], allocs: &[usize], k: usize) -> Option<Gelu> {
    let ip = allocs[k];
    if k < 2 || op(t, ev[ip].tensor) != "aten::pow" {
        return None;
    }
    let (ia, im, layer) = (allocs[k - 2], allocs[k - 1], ev[ip].layer);
    let (a, m, p) = (ev[ia].tensor, ev[im].tensor, ev[ip].tensor);
    let law = t.tensors[a as usize].law;
    if op(t, a) != "aten::addmm"
        || op(t, m) != "aten::mul"
        || t.tensors[m as usize].law != law
        || t.tensors[p as usize].law != law
        || ev[ia].layer != layer
        || ev[im].layer != layer
    {
        return None;
    }
    let chain: Vec<usize> = allocs[k..]
        .iter()
        .copied()
        .take_while(|&i| t.tensors[ev[i].tensor as usize].law == law && ev[i].layer == layer)
        .collect();
    let &iw = allocs.get(k + chain.len())?;
    if !chain.iter().any(|&i| op(t, ev[i].tensor) == "aten::tanh") {
        return None;
    }
    let &io = allocs[k + chain.len()..].iter().find(|&&i| op(t, ev[i].tensor) == "aten::addmm")?;
    Some(Gelu { ia, im, ip, chain, iw, io, law, layer })
}

fn free_of(ev: &[EventT], x: u32, from: usize) -> Option<usize> {
    (from..ev.len()).find(|&i| ev[i].free && ev[i].tensor == x)
}

/// The forward in fp32: autocast's fp32 copy of `x` for the `pow`, kept by its backward where
/// the recording kept `x`, or gone with the `pow` where nothing keeps it (checkpointing's first
/// forward); `c_proj`'s bf16 copy of the fp32 GELU, its saved input where the recording kept
/// the GELU's output. Where both are kept, the event that frees the GELU's output, for the
/// backward.
fn forward(
    t: &mut Template,
    ev: &[EventT],
    allocs: &[usize],
    g: &Gelu,
    edits: &mut Edits,
    scaled: &mut HashSet<u32>,
) -> Option<usize> {
    let (a, out) = (ev[g.ia].tensor, *g.chain.last()?);
    let gl = ev[out].tensor;
    let (fa, fg) = (free_of(ev, a, g.ia)?, free_of(ev, gl, out)?);
    for &i in &g.chain {
        scaled.insert(ev[i].tensor);
    }
    let x32 = new_tensor(t, a, g.law.scaled(2.0), "aten::pow > aten::to (autocast's fp32 copy)");
    edits.after.entry(g.im).or_default().push(alloc(x32, g.layer));
    let a_held = fa > g.io;
    if a_held {
        edits.replace.insert(fa, free(x32, ev[fa].layer));
        edits.after.entry(out).or_default().push(free(a, g.layer));
    } else {
        edits.after.entry(g.ip).or_default().push(free(x32, g.layer));
    }
    let g16 = new_tensor(t, gl, g.law, "aten::addmm > aten::to (autocast's bf16 copy)");
    edits.after.entry(g.iw).or_default().push(alloc(g16, g.layer));
    let g_held = allocs.iter().any(|&i| i > g.io && i < fg);
    if g_held {
        edits.replace.insert(fg, free(g16, ev[fg].layer));
        edits.after.entry(g.io).or_default().push(free(gl, g.layer));
    } else {
        edits.after.entry(g.io).or_default().push(free(g16, g.layer));
    }
    (a_held && g_held).then_some(fg)
}

/// The backward in fp32: from `c_proj`'s input gradient `dG` (bf16), through `G = 0.5x·u`
/// (`dU`, `dM`), `tanh`, the two constant products and the `pow`, with the casts to each bf16
/// input's dtype autograd makes.
fn backward_fp32(
    t: &mut Template,
    ev: &[EventT],
    allocs: &[usize],
    g: &Gelu,
    fg: usize,
    edits: &mut Edits,
    scaled: &mut HashSet<u32>,
) {
    let (law, gl) = (g.law, ev[*g.chain.last().expect("a chain")].tensor);
    let Some(idg) = (0..fg).rev().find(|&i| {
        !ev[i].free
            && ev[i].tensor != gl
            && t.tensors[ev[i].tensor as usize].law == law
            && op(t, ev[i].tensor) == "aten::mm"
    }) else {
        return;
    };
    let bwd: Vec<usize> =
        allocs.iter().copied().filter(|&i| i > fg && t.tensors[ev[i].tensor as usize].law == law).take(8).collect();
    let names = [
        "MulBackward0",
        "MulBackward0",
        "TanhBackward0",
        "MulBackward0",
        "MulBackward0",
        "PowBackward0",
        "PowBackward0",
        "PowBackward0",
    ];
    if bwd.len() < 8 || !bwd.iter().zip(names).all(|(&i, n)| site_has(t, ev[i].tensor, n)) {
        return;
    }
    let dg = ev[idg].tensor;
    let Some(fdg) = free_of(ev, dg, idg) else { return };
    let [du, dm, tb, s1, s2, p1, p2, p3] = [0, 1, 2, 3, 4, 5, 6, 7].map(|j| bwd[j]);
    let bl = ev[du].layer;
    // dG to fp32 (the backward of `c_proj`'s cast), the bf16 one gone at once.
    let dg32 = new_tensor(
        t,
        dg,
        law.scaled(2.0),
        "autograd::engine::evaluate_function: ToCopyBackward0 > aten::to (fp32 gradient)",
    );
    edits.before.entry(du).or_default().extend([alloc(dg32, bl), free(dg, bl)]);
    edits.replace.insert(fdg, free(dg32, ev[fdg].layer));
    // dM (for the bf16 `0.5·x`) made in fp32 and cast to bf16.
    let dm32 = new_tensor(
        t,
        ev[dm].tensor,
        law.scaled(2.0),
        "autograd::engine::evaluate_function: MulBackward0 > aten::mul (fp32)",
    );
    edits.before.entry(dm).or_default().push(alloc(dm32, bl));
    edits.after.entry(dm).or_default().push(free(dm32, bl));
    // The gradient of `x` through the sum `x + 0.044715·x³`, cast to bf16: the buffer the
    // other two of `x`'s gradients are added into, where the recording used the fp32 one.
    let da = new_tensor(
        t,
        ev[s1].tensor,
        law,
        "autograd::engine::evaluate_function: AddBackward0 > aten::to (bf16 gradient)",
    );
    edits.before.entry(s2).or_default().push(alloc(da, bl));
    edits.after.entry(s2).or_default().push(free(ev[s1].tensor, bl));
    if let Some(fs1) = free_of(ev, ev[s1].tensor, s1) {
        edits.replace.insert(fs1, free(da, ev[fs1].layer));
    }
    // The pow's gradient of `x`, cast to bf16 to be added in.
    if let Some(fp3) = free_of(ev, ev[p3].tensor, p3) {
        let c = new_tensor(
            t,
            ev[p3].tensor,
            law,
            "autograd::engine::evaluate_function: ToCopyBackward0 > aten::to (bf16 gradient)",
        );
        edits.before.entry(fp3).or_default().push(alloc(c, ev[fp3].layer));
        edits.after.entry(fp3).or_default().push(free(c, ev[fp3].layer));
    }
    for i in [du, tb, s1, s2, p1, p2, p3] {
        scaled.insert(ev[i].tensor);
    }
}
