//! A template's events expanded to the model's depth: the first [`EDGE`] and last [`EDGE`]
//! layers of each stack as recorded, the middle layer's events repeated for every layer
//! between (see [`super`]).

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
}

impl<'t> Expander<'t> {
    pub(crate) fn new(t: &'t Template, layers: [u32; 2]) -> Expander<'t> {
        Expander { layers, analog: &t.analog }
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

    /// Whether concrete layer `c` of `stack` is a replica of the middle layer.
    fn is_replica(&self, stack: u8, c: u32) -> bool {
        (EDGE..self.layers[stack as usize].saturating_sub(EDGE)).contains(&c)
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
    /// (replica `j` where `ctx` is the middle layer) touches: the tensor made there (the
    /// middle layer's where the layer is one of its replicas) and its concrete layer.
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
                (here + h.n as i64 - c.n as i64) as u32
            }
            _ => self.concrete(h.n, h.stack, None),
        };
        let tensor = match self.analog.get(&tensor) {
            Some(&m) if !h.is_middle() && self.is_replica(h.stack, layer) => m,
            _ => tensor,
        };
        (tensor, Some((h.stack, layer)))
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
