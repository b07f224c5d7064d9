//! A seeded workload for the tests that record headroom's own runs under PyTorch's rules and
//! check them: steps of allocations on three streams, some used on another stream before they
//! are freed, a share of each step kept alive across steps, events completing now and then,
//! and with `empty_cache` the cache emptied now and then. `seed` picks which.

use headroom_trace::jsonl::{TraceLine, TraceOp};

#[path = "xorshift.rs"]
mod xorshift;
use xorshift::xorshift;

const MIB: u64 = 1 << 20;

pub fn workload(seed: u64, steps: usize, empty_cache: bool) -> Vec<TraceLine> {
    let mut list = Vec::new();
    let mut rand = xorshift(seed);
    let mut kept: Vec<String> = Vec::new();
    for step in 0..steps {
        let mut temps = Vec::new();
        for k in 0..1 + rand(14) {
            let id = format!("s{step}k{k}");
            let size = match rand(4) {
                0 => 512 + rand(4096),
                1 => MIB + rand(3 * MIB),
                _ => 6 * MIB + rand(20 * MIB),
            };
            list.push(TraceOp::Alloc { id: id.clone(), size, stream: rand(3) });
            if rand(3) == 0 {
                list.push(TraceOp::RecordStream { id: id.clone(), stream: 3 + rand(2) });
            }
            temps.push(id);
        }
        if rand(3) == 0 {
            kept.push(temps.pop().expect("one a step at least"));
        }
        if kept.len() > 6 {
            list.push(TraceOp::Free { id: kept.remove(rand(kept.len() as u64) as usize) });
        }
        for id in temps {
            list.push(TraceOp::Free { id });
        }
        if empty_cache {
            match rand(6) {
                0 | 1 => list.push(TraceOp::CompleteEvents),
                2 => list.push(TraceOp::EmptyCache),
                _ => {}
            }
        } else if rand(3) == 0 {
            list.push(TraceOp::CompleteEvents);
        }
    }
    list.into_iter().enumerate().map(|(i, op)| TraceLine { line: i + 1, op }).collect()
}
