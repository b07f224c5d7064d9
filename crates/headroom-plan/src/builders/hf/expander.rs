//! A template's events expanded to the model's depth: the first [`EDGE`] and last [`EDGE`]
//! layers of each stack as recorded, the middle layer's events repeated for every layer
//! between (see [`super`]).
//!
//! Invariants (debug-checked where they are used; every training template is expanded at each
//! depth from `2 × EDGE` up and held to them in the tests below):
//! - concrete layer `c` of a stack of `n` layers runs recorded layer [`Expander::recorded`]`(c)`:
//!   `c` for the first [`EDGE`], `c + RECORDED_LAYERS − n` for the last [`EDGE`], the middle
//!   layer for every one between, so at `n = 2 × EDGE` the middle layer runs nowhere and its
//!   events are not replayed;
//! - an event names a tensor of the concrete layer it reaches as that layer made it: the
//!   recorded tensor where the layer runs the tensor's own recorded layer, else the tensor made
//!   in its place by the layer the concrete layer runs (matched through the middle layer,
//!   `Template::analog`). So a free that the recording makes in one layer, of a tensor made
//!   in the layer before, frees the instance the layer before made at every depth, the edge
//!   layers' own included where the middle layer between them is not replayed;
//! - hence every free names an instance the expansion made, once.

use super::Concrete;
use crate::program_template::{EventT, Layer, Template, EDGE, RECORDED_LAYERS};
use rustc_hash::FxHashMap;

pub(crate) struct Expander<'t> {
    pub(crate) layers: [u32; 2],
    /// An edge layer's tensor → the middle layer's tensor made in its place. A tensor made in
    /// one layer and freed in the next (a layer's output, freed once the next layer's residual
    /// add has used it) is freed by an event of the next layer that names the recorded
    /// previous layer's tensor; where that previous layer is a replica of the middle one, the
    /// tensor it made is the middle layer's, and the event must name that one.
    analog: &'t FxHashMap<u32, u32>,
    /// The inverse, per edge layer: (the middle layer's tensor, an edge layer) → the edge
    /// layer's tensor made in its place. Where a stack has no replica of the middle layer,
    /// the layer before recorded layer `EDGE + 1` is recorded layer `EDGE − 1`, and an event of
    /// the one that names the middle layer's tensor must name the other's.
    edge_analog: FxHashMap<(u32, Layer), u32>,
}

impl<'t> Expander<'t> {
    pub(crate) fn new(t: &'t Template, layers: [u32; 2]) -> Expander<'t> {
        let mut edge_analog = FxHashMap::default();
        for (&edge, &middle) in &t.analog {
            if let Some(h) = t.tensors[edge as usize].home {
                let previous = edge_analog.insert((middle, h), edge);
                debug_assert!(previous.is_none(), "two tensors of layer {h:?} matched to middle tensor {middle}");
            }
        }
        Expander { layers, analog: &t.analog, edge_analog }
    }

    /// Concrete layer `n` of `stack` numbered in forward order across the stacks: T5's
    /// encoder (stack 1) before its decoder (stack 0).
    pub(crate) fn numbered(&self, stack: u8, n: u32) -> u32 {
        if stack == 1 {
            n
        } else {
            self.layers[1] + n
        }
    }

    /// The recorded layer that concrete layer `c` of `stack` runs.
    fn recorded(&self, stack: u8, c: u32) -> Layer {
        let n = self.layers[stack as usize];
        debug_assert!(c < n, "concrete layer {c} of a stack of {n}");
        let r = if c < EDGE {
            c
        } else if c >= n.saturating_sub(EDGE) {
            c + RECORDED_LAYERS - n
        } else {
            EDGE
        };
        Layer { stack, n: r as u8 }
    }

    pub(crate) fn concrete(&self, n: u8, stack: u8, j: Option<u32>) -> u32 {
        let n = n as u32;
        if n < EDGE {
            n
        } else if n >= RECORDED_LAYERS - EDGE {
            self.layers[stack as usize] - (RECORDED_LAYERS - n)
        } else {
            j.unwrap_or(EDGE)
        }
    }

    /// Which instance of template tensor `tensor`, of home layer `h`, an event at `ctx`
    /// (replica `j` where `ctx` is the middle layer) touches: the tensor that the recorded
    /// layer run at the concrete layer reached makes in its place, and that concrete layer.
    pub(crate) fn instance(
        &self,
        tensor: u32,
        h: Option<Layer>,
        ctx: Option<Layer>,
        j: Option<u32>,
    ) -> (u32, Option<Concrete>) {
        let Some(h) = h else { return (tensor, None) };
        let layer = match ctx {
            Some(c) if c.stack == h.stack && (h.n as i64 - c.n as i64).unsigned_abs() <= EDGE as u64 => {
                let here = self.concrete(c.n, c.stack, j) as i64;
                let reached = here + h.n as i64 - c.n as i64;
                debug_assert!(
                    (0..self.layers[h.stack as usize] as i64).contains(&reached),
                    "an event of layer {c:?} reaches concrete layer {reached}"
                );
                reached as u32
            }
            _ => self.concrete(h.n, h.stack, None),
        };
        (self.made_at(tensor, h, self.recorded(h.stack, layer)), Some((h.stack, layer)))
    }

    /// Template tensor `tensor`, of recorded layer `h`, as recorded layer `r` makes it: itself
    /// where `r` is `h`, else the tensor matched to it through the middle layer. A tensor with
    /// no match (the last layer's final norm) stands for itself.
    fn made_at(&self, tensor: u32, h: Layer, r: Layer) -> u32 {
        if r == h {
            return tensor;
        }
        let middle = if h.is_middle() {
            tensor
        } else {
            match self.analog.get(&tensor) {
                Some(&m) => m,
                None => return tensor,
            }
        };
        if r.is_middle() {
            middle
        } else {
            self.edge_analog.get(&(middle, r)).copied().unwrap_or(tensor)
        }
    }

    /// The events of a section expanded: (event, replica of the middle layer).
    pub(crate) fn expand(&self, events: &[EventT]) -> Vec<(EventT, Option<u32>)> {
        let mut out = Vec::with_capacity(events.len() * 2);
        let mut i = 0;
        while i < events.len() {
            let e = events[i];
            let Some(ctx) = e.layer.filter(|l| l.is_middle()) else {
                out.push((e, None));
                i += 1;
                continue;
            };
            let mut end = i;
            while end < events.len() && events[end].layer == Some(ctx) {
                end += 1;
            }
            let outer = |e: &EventT| e.layer.filter(|l| l.stack == ctx.stack && !l.is_middle()).map(|l| l.n);
            let before = events[..i].iter().rev().find_map(outer);
            let after = events[end..].iter().find_map(outer);
            let ascending = match (before, after) {
                (Some(b), _) => b < ctx.n,
                (None, Some(a)) => a > ctx.n,
                (None, None) => true,
            };
            let replicas = EDGE..self.layers[ctx.stack as usize] - EDGE;
            let run = &events[i..end];
            let mut push = |j: u32| out.extend(run.iter().map(|&e| (e, Some(j))));
            if ascending {
                replicas.for_each(&mut push);
            } else {
                replicas.rev().for_each(&mut push);
            }
            i = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program_template::{self, DecoderLength};
    use std::collections::{HashMap, HashSet};

    /// Every training template expanded at each depth from the smallest the planner expands to
    /// (`2 × EDGE`, where the middle layer is not replayed) to two replicas of the middle layer:
    /// each free names an instance the expansion made and has not freed, and each tensor the
    /// recording makes and frees inside a step is freed inside that step at every depth. At four
    /// layers a layer's output, freed in the recording by the next layer's backward, must be
    /// freed by the backward of the layer that follows it there, not left live past it.
    #[test]
    fn every_depth_frees_what_it_makes() {
        let mut checked = 0;
        for key in program_template::keys() {
            let Some(parsed) = program_template::template(key) else { continue };
            if parsed.template.inference.is_some() {
                continue;
            }
            let t = parsed.resolved(&|_| 1.0, DecoderLength::Encoder);
            for n in 2 * EDGE..=RECORDED_LAYERS + 1 {
                let ex = Expander::new(&t, [n, n]);
                let mut made: HashMap<(u32, Option<Concrete>), (&str, u32)> = HashMap::new();
                let step1 = t.step1.as_deref().unwrap_or(&t.step);
                for (name, events) in [("setup", &t.setup[..]), ("step1", step1), ("step", &t.step[..])] {
                    let freed_inside: HashSet<u32> = {
                        let made_here: HashSet<u32> = events.iter().filter(|e| !e.free).map(|e| e.tensor).collect();
                        events.iter().filter(|e| e.free && made_here.contains(&e.tensor)).map(|e| e.tensor).collect()
                    };
                    for (e, j) in ex.expand(events) {
                        let inst = ex.instance(e.tensor, t.tensors[e.tensor as usize].home, e.layer, j);
                        if e.free {
                            assert!(
                                made.remove(&inst).is_some(),
                                "{key} at {n} layers, {name}: a free of {inst:?} (recorded as tensor {} of {:?}, \
                                 freed in {:?}), which the expansion did not make or freed already",
                                e.tensor,
                                t.tensors[e.tensor as usize].home,
                                e.layer
                            );
                        } else {
                            made.insert(inst, (name, e.tensor));
                        }
                    }
                    let left: Vec<_> = made
                        .iter()
                        .filter(|(_, &(section, x))| section == name && freed_inside.contains(&x))
                        .map(|(inst, _)| *inst)
                        .collect();
                    assert!(
                        left.is_empty(),
                        "{key} at {n} layers, {name}: {} tensors freed inside the recorded section are left live, \
                         e.g. {:?}",
                        left.len(),
                        left.first()
                    );
                }
            }
            checked += 1;
        }
        assert!(checked > 0, "no template was checked");
    }
    /// The inference templates likewise: at each depth from `2 × EDGE`, each free names an
    /// instance the expansion made (a decode step's [`EventT::previous`] frees, one the step
    /// before made).
    #[test]
    fn every_depth_frees_what_it_makes_in_inference() {
        let mut checked = 0;
        for key in program_template::keys() {
            let Some(parsed) = program_template::template(key) else { continue };
            let Some(sections) = parsed.template.inference.clone() else { continue };
            let t = parsed.resolved(&|_| 1.0, DecoderLength::Encoder);
            for n in 2 * EDGE..=RECORDED_LAYERS + 1 {
                let ex = Expander::new(&t, [n, n]);
                let mut made = HashSet::new();
                let mut previous = HashSet::new();
                let parts: [(&str, &[EventT]); 4] = [
                    ("setup", &t.setup),
                    ("prefill", &sections.prefill),
                    ("decode1", &sections.decode1),
                    ("decode", &sections.decode),
                ];
                for (name, events) in parts {
                    let decode = name.starts_with("decode");
                    let mut current = HashSet::new();
                    for (e, j) in ex.expand(events) {
                        let inst = ex.instance(e.tensor, t.tensors[e.tensor as usize].home, e.layer, j);
                        if !e.free {
                            if decode {
                                current.insert(inst)
                            } else {
                                made.insert(inst)
                            };
                            continue;
                        }
                        let found = if e.previous {
                            previous.remove(&inst)
                        } else {
                            current.remove(&inst) || made.remove(&inst)
                        };
                        assert!(
                            found,
                            "{key} at {n} layers, {name}: a free of {inst:?} (recorded as tensor {} of {:?}, freed \
                             in {:?}), which the expansion did not make or freed already",
                            e.tensor, t.tensors[e.tensor as usize].home, e.layer
                        );
                    }
                    if decode {
                        previous = current;
                    }
                }
            }
            checked += 1;
        }
        assert!(checked > 0, "no inference template was checked");
    }
}
