//! PyTorch's pipeline schedules (`torch.distributed.pipelining.schedules`), as the
//! order of actions each pipeline rank runs: which stage, which micro-batch, forward or
//! backward. The step program of a pipelined job (`builders::fsdp2::pipeline`) walks this
//! order, so a rank holds exactly the micro-batches its schedule has in flight
//! (research/fsdp2-torchtitan-memory.md §5).
//!
//! | schedule | stages per rank | what decides the micro-batches in flight |
//! |---|---|---|
//! | `Schedule1F1B` | 1 | `warmup_chunks = min(n_microbatches, num_stages - stage_index)` forwards, then backward-first 1B1F |
//! | `ScheduleInterleaved1F1B` | ≥ 2, looped (`rank + k·pp`) | `_get_warmup_ops(multiply_factor=2)`: `(v-1)·microbatches_per_round + 2·(pp-1-rank)`, capped at `v·n_microbatches`; then F before B |
//! | `ScheduleInterleavedZeroBubble` (ZB1P) | ≥ 2, looped | `_get_warmup_ops(multiply_factor=1)`; backward split into input (I) and weight (W) halves, W deferred by `rank` micro-batches |
//! | `ScheduleZBVZeroBubble` | exactly 2, V-shaped (`rank`, `2·pp-1-rank`) | `2·(pp-rank)-1` chunk-0 forwards, then chunk-1 F, I, W |

use crate::names::named;

/// A pipeline schedule, by PyTorch's class (`get_schedule_class`'s names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PipelineSchedule {
    /// `Schedule1F1B`: one stage per rank, one forward then one backward in steady state.
    #[default]
    Schedule1F1B,
    /// `ScheduleInterleaved1F1B`: several model chunks per rank, looped.
    Interleaved1F1B,
    /// `ScheduleInterleavedZeroBubble` (ZB1P): interleaved, the backward split in two.
    InterleavedZeroBubble,
    /// `ScheduleZBVZeroBubble`: two chunks per rank in a V.
    ZbvZeroBubble,
}

named!(PipelineSchedule {
    Schedule1F1B => ("1f1b", "PyTorch's Schedule1F1B: one stage per rank; the first rank holds min(micro-batches, pp) in flight"),
    Interleaved1F1B => ("interleaved-1f1b", "ScheduleInterleaved1F1B: --vpp ≥ 2 looped chunks per rank (2 if not given), more in flight, a smaller bubble"),
    InterleavedZeroBubble => ("zero-bubble", "ScheduleInterleavedZeroBubble (ZB1P): interleaved, the weight gradients deferred into the bubble"),
    ZbvZeroBubble => ("zbv", "ScheduleZBVZeroBubble: exactly 2 chunks per rank in a V, the first rank holding the first and last stage"),
});

impl PipelineSchedule {
    /// PyTorch's class name.
    pub fn class(self) -> &'static str {
        match self {
            PipelineSchedule::Schedule1F1B => "1F1B",
            PipelineSchedule::Interleaved1F1B => "Interleaved1F1B",
            PipelineSchedule::InterleavedZeroBubble => "InterleavedZeroBubble",
            PipelineSchedule::ZbvZeroBubble => "ZBVZeroBubble",
        }
    }

    /// Whether it runs several stages per rank (`PipelineScheduleMulti`).
    pub fn looped(self) -> bool {
        self != PipelineSchedule::Schedule1F1B
    }

    /// Whether its backward is split into input and weight halves.
    pub fn zero_bubble(self) -> bool {
        matches!(self, PipelineSchedule::InterleavedZeroBubble | PipelineSchedule::ZbvZeroBubble)
    }
}

/// What a pipeline stage keeps of its outputs once their backward has run: the micro-batches'
/// outputs PyTorch's `_PipelineStageBase.output_chunks` collects for `step()` to merge and
/// return, which changed twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StageOutputs {
    /// torchtitan since October 2025 (e5ef99aab) calls `step(return_outputs=False)`: nothing is
    /// collected, and each output lives until its backward.
    #[default]
    None,
    /// PyTorch 2.8 on (#153383, May 2025), with `return_outputs` left on: the last stage keeps
    /// every micro-batch's output (the logits, their autograd graph detached) to the next step,
    /// and `_merge_outputs` concatenates them when the schedule ends.
    LastStage,
    /// PyTorch before 2.8 (torchtitan of 2024 and early 2025): every stage keeps every
    /// micro-batch's output to the next step; the last stage's are concatenated as above.
    EveryStage,
}

named!(StageOutputs {
    None => ("none", "torchtitan since October 2025 (step(return_outputs=False)): each output lives until its backward"),
    LastStage => ("last", "PyTorch 2.8 on, return_outputs left on: the last stage keeps every micro-batch's logits for the step and concatenates them at its end"),
    EveryStage => ("every", "PyTorch before 2.8 (torchtitan of 2024 and early 2025): every stage keeps every micro-batch's output for the step, the last stage's concatenated at its end"),
});

impl StageOutputs {
    /// Whether a stage (the last one, or any) keeps its outputs for the whole step.
    pub fn kept(self, last_stage: bool) -> bool {
        match self {
            StageOutputs::None => false,
            StageOutputs::LastStage => last_stage,
            StageOutputs::EveryStage => true,
        }
    }
}

/// What one action computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `F`: the stage's forward of a micro-batch.
    Forward,
    /// `B`: the full backward (inputs and weights).
    Backward,
    /// `I`: the backward to the stage's input only (`stage_backward_input`).
    BackwardInput,
    /// `W`: the weights' gradients (`stage_backward_weight`).
    BackwardWeight,
}

/// One action of a rank's schedule: `{stage}{F|B|I|W}{microbatch}` in PyTorch's notation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    pub stage: u64,
    pub kind: Kind,
    pub microbatch: u64,
}

/// The global stage indices rank `rank` holds: one for 1F1B, `rank + k·pp` for the looped
/// schedules, `rank` and `2·pp-1-rank` for the V (`generate_rank_to_stage_mapping`).
pub fn stages_of_rank(schedule: PipelineSchedule, pp: u64, v: u64, rank: u64) -> Vec<u64> {
    match schedule {
        PipelineSchedule::Schedule1F1B => vec![rank],
        PipelineSchedule::ZbvZeroBubble => vec![rank, 2 * pp - 1 - rank],
        _ => (0..v).map(|k| rank + k * pp).collect(),
    }
}

/// `_get_warmup_ops`: the forwards an interleaved rank runs before its first backward.
pub fn warmup_ops(rank: u64, n_local_stages: u64, microbatches_per_round: u64, pp: u64, n_mb: u64, factor: u64) -> u64 {
    let last_stage = (n_local_stages - 1) * microbatches_per_round;
    (last_stage + factor * (pp - 1 - rank)).min(n_mb * n_local_stages)
}

/// `Schedule1F1B`'s `warmup_chunks`.
pub fn warmup_chunks_1f1b(n_mb: u64, num_stages: u64, stage_index: u64) -> u64 {
    n_mb.min(num_stages - stage_index)
}

/// `max(1, n_microbatches // pp)` rounds of `microbatches_per_round`; PyTorch refuses a
/// micro-batch count the rounds do not divide.
pub fn microbatches_per_round(pp: u64, n_mb: u64) -> Result<u64, String> {
    let rounds = (n_mb / pp).max(1);
    if !n_mb.is_multiple_of(rounds) {
        return Err(format!(
            "the interleaved schedules need the micro-batches ({n_mb}) to be a multiple of their rounds, \
             max(1, micro-batches / pp) = {rounds} (PyTorch's ScheduleInterleaved1F1B refuses them)"
        ));
    }
    Ok(n_mb / rounds)
}

/// Rank `rank`'s actions in order, as PyTorch's schedule builds them (the idle slots
/// left out). `pp` ranks, `v` stages per rank, `n_mb` micro-batches.
pub fn rank_actions(schedule: PipelineSchedule, pp: u64, v: u64, n_mb: u64, rank: u64) -> Result<Vec<Action>, String> {
    let act = |stage, kind, microbatch| Action { stage, kind, microbatch };
    match schedule {
        PipelineSchedule::Schedule1F1B => {
            // `Schedule1F1B._step_microbatches`: warmup forwards, then "1B1F" (backward
            // first), then the remaining backwards.
            let warmup = warmup_chunks_1f1b(n_mb, pp, rank);
            let mut out: Vec<Action> = (0..warmup).map(|mb| act(rank, Kind::Forward, mb)).collect();
            let (mut f, mut b) = (warmup, 0);
            while b < n_mb {
                out.push(act(rank, Kind::Backward, b));
                b += 1;
                if f < n_mb {
                    out.push(act(rank, Kind::Forward, f));
                    f += 1;
                }
            }
            Ok(out)
        }
        PipelineSchedule::Interleaved1F1B | PipelineSchedule::InterleavedZeroBubble => {
            let zb = schedule == PipelineSchedule::InterleavedZeroBubble;
            let per_round = microbatches_per_round(pp, n_mb)?;
            let warmup = warmup_ops(rank, v, per_round, pp, n_mb, if zb { 1 } else { 2 });
            let microbatch_ops = v * n_mb;
            let fwd_bwd = microbatch_ops - warmup;
            let cooldown = microbatch_ops - fwd_bwd;
            let forward_stage = |step: u64| ((step / per_round) % v) * pp + rank;
            let backward_stage = |step: u64| (v - 1 - ((step - warmup) / per_round) % v) * pp + rank;
            // `_get_1f1b_rank_ops`, counters per stage.
            let mut f_mb = vec![0u64; (v * pp) as usize];
            let mut b_mb = vec![0u64; (v * pp) as usize];
            let mut w_mb = vec![0u64; (v * pp) as usize];
            let next = |counter: &mut Vec<u64>, stage: u64| {
                let mb = counter[stage as usize];
                counter[stage as usize] += 1;
                mb
            };
            let backward = if zb { Kind::BackwardInput } else { Kind::Backward };
            // ZB1P: rank r runs its first r backwards as 1F1B, deferring their weights.
            let num_1f1b = if zb { rank } else { 0 };
            let mut out = Vec::new();
            let mut backward_ops: Vec<u64> = Vec::new();
            let mut weights_done = 0usize;
            for op in 0..warmup + fwd_bwd + cooldown {
                if op < warmup + fwd_bwd {
                    let s = forward_stage(op);
                    let mb = next(&mut f_mb, s);
                    out.push(act(s, Kind::Forward, mb));
                }
                if op >= warmup {
                    let s = backward_stage(op);
                    let mb = next(&mut b_mb, s);
                    out.push(act(s, backward, mb));
                    backward_ops.push(op);
                    if zb && op - warmup >= num_1f1b {
                        let s = backward_stage(backward_ops[weights_done]);
                        let mb = next(&mut w_mb, s);
                        out.push(act(s, Kind::BackwardWeight, mb));
                        weights_done += 1;
                    }
                }
            }
            while zb && weights_done < backward_ops.len() {
                let s = backward_stage(backward_ops[weights_done]);
                let mb = next(&mut w_mb, s);
                out.push(act(s, Kind::BackwardWeight, mb));
                weights_done += 1;
            }
            Ok(out)
        }
        PipelineSchedule::ZbvZeroBubble => {
            // `ScheduleZBVZeroBubble._calculate_single_rank_operations`, with the actions of
            // micro-batches beyond n_mb (its n_micro is at least 2·pp-1) dropped as PyTorch does.
            let n_micro = (2 * pp - 1).max(n_mb);
            let (c0, c1) = (rank, 2 * pp - 1 - rank);
            let (mut f0, mut f1, mut b0, mut b1) = (0u64, 0u64, 0u64, 0u64);
            let mut out = Vec::new();
            for _ in 0..2 * (pp - rank) - 1 {
                out.push(act(c0, Kind::Forward, f0));
                f0 += 1;
            }
            for _ in 0..rank {
                out.push(act(c1, Kind::Forward, f1));
                f1 += 1;
                out.push(act(c0, Kind::Forward, f0));
                f0 += 1;
            }
            for _ in 0..pp - rank {
                out.push(act(c1, Kind::Forward, f1));
                f1 += 1;
                out.push(act(c1, Kind::BackwardInput, b1));
                out.push(act(c1, Kind::BackwardWeight, b1));
                b1 += 1;
            }
            while f1 < f0 || f0 < n_micro {
                if f0 < n_micro {
                    out.push(act(c0, Kind::Forward, f0));
                    f0 += 1;
                }
                out.push(act(c0, Kind::BackwardInput, b0));
                out.push(act(c0, Kind::BackwardWeight, b0));
                b0 += 1;
                out.push(act(c1, Kind::Forward, f1));
                f1 += 1;
                out.push(act(c1, Kind::BackwardInput, b1));
                out.push(act(c1, Kind::BackwardWeight, b1));
                b1 += 1;
            }
            let (mut w0, mut w1) = (b0, b1);
            for _ in 0..rank {
                out.push(act(c0, Kind::BackwardInput, b0));
                b0 += 1;
                out.push(act(c1, Kind::BackwardInput, b1));
                b1 += 1;
            }
            for _ in 0..pp - rank {
                out.push(act(c0, Kind::BackwardInput, b0));
                b0 += 1;
                out.push(act(c0, Kind::BackwardWeight, w0));
                w0 += 1;
            }
            while w1 < b1 {
                out.push(act(c1, Kind::BackwardWeight, w1));
                w1 += 1;
            }
            while w0 < b0 {
                out.push(act(c0, Kind::BackwardWeight, w0));
                w0 += 1;
            }
            out.retain(|a| a.microbatch < n_mb);
            Ok(out)
        }
    }
}

/// The most micro-batch chunks a rank's schedule holds at once: forwards whose backward
/// (B, or I for the split schedules) has not run yet.
pub fn peak_in_flight(actions: &[Action]) -> u64 {
    let (mut live, mut peak) = (0u64, 0u64);
    for a in actions {
        match a.kind {
            Kind::Forward => {
                live += 1;
                peak = peak.max(live);
            }
            Kind::Backward | Kind::BackwardInput => live -= 1,
            Kind::BackwardWeight => {}
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;
    use PipelineSchedule::*;

    /// Every forward has exactly one backward (and, split, one weight step) after it.
    fn complete(actions: &[Action], stages: &[u64], n_mb: u64, split: bool) {
        for &s in stages {
            for mb in 0..n_mb {
                let at = |k: Kind| actions.iter().position(|a| *a == Action { stage: s, kind: k, microbatch: mb });
                let f = at(Kind::Forward).unwrap_or_else(|| panic!("{s}F{mb} missing"));
                if split {
                    let i = at(Kind::BackwardInput).expect("I");
                    let w = at(Kind::BackwardWeight).expect("W");
                    assert!(f < i && i < w, "{s}: F{mb} I W out of order");
                } else {
                    assert!(f < at(Kind::Backward).expect("B"));
                }
            }
        }
        let per = if split { 3 } else { 2 };
        assert_eq!(actions.len() as u64, per * n_mb * stages.len() as u64);
    }

    #[test]
    fn one_f_one_b_warms_up_min_of_micro_batches_and_stages_left() {
        // research §5: stage 0 holds min(n_mb, pp).
        assert_eq!(warmup_chunks_1f1b(32, 8, 0), 8);
        assert_eq!(warmup_chunks_1f1b(32, 8, 7), 1);
        assert_eq!(warmup_chunks_1f1b(4, 8, 0), 4);
        for rank in 0..8 {
            let a = rank_actions(Schedule1F1B, 8, 1, 32, rank).unwrap();
            complete(&a, &[rank], 32, false);
            assert_eq!(peak_in_flight(&a), 8 - rank);
        }
    }

    #[test]
    fn interleaved_warmup_is_pytorchs_formula() {
        // research §5: warmup = min((v-1)·mb_per_round + 2(pp-1-rank), n_mb·v); peak = warmup + 1
        // (F before B in steady state); for n_mb a multiple of pp, rank 0 holds (v+1)·pp - 1.
        let (pp, v, n) = (8, 2, 32);
        assert_eq!(microbatches_per_round(pp, n).unwrap(), 8);
        assert_eq!(warmup_ops(0, v, 8, pp, n, 2), 8 + 14);
        assert_eq!(warmup_ops(7, v, 8, pp, n, 2), 8);
        let a = rank_actions(Interleaved1F1B, pp, v, n, 0).unwrap();
        complete(&a, &[0, 8], n, false);
        assert_eq!(peak_in_flight(&a), (v + 1) * pp - 1);
        // Capped at every chunk of every micro-batch.
        assert_eq!(warmup_ops(0, 2, 4, 4, 4, 2), 8);
        // More in flight than 1F1B at equal micro-batches, in chunks half a stage each:
        // 23 half-stages against 8 whole ones = 11.5 stage-equivalents, ≈ pp·(1 + 1/v).
        let one = peak_in_flight(&rank_actions(Schedule1F1B, pp, 1, n, 0).unwrap());
        assert!(peak_in_flight(&a) as f64 / v as f64 > one as f64);
        // Micro-batches the rounds do not divide are refused, as PyTorch does.
        assert!(microbatches_per_round(8, 17).is_err());
        assert_eq!(microbatches_per_round(4, 10).unwrap(), 5);
    }

    #[test]
    fn zero_bubble_warms_up_one_per_hop_and_defers_weights_by_rank() {
        // research §5: warmup = (v-1)·mb_per_round + (pp-1-rank); rank 0 runs W right after I.
        let (pp, v, n) = (8, 2, 16);
        assert_eq!(warmup_ops(0, v, 8, pp, n, 1), 8 + 7);
        let a0 = rank_actions(InterleavedZeroBubble, pp, v, n, 0).unwrap();
        complete(&a0, &[0, 8], n, true);
        assert_eq!(peak_in_flight(&a0), 8 + 7 + 1);
        let first_i = a0.iter().position(|a| a.kind == Kind::BackwardInput).unwrap();
        assert_eq!(a0[first_i + 1].kind, Kind::BackwardWeight);
        let a3 = rank_actions(InterleavedZeroBubble, pp, v, n, 3).unwrap();
        complete(&a3, &[3, 11], n, true);
        let first_i = a3.iter().position(|a| a.kind == Kind::BackwardInput).unwrap();
        let first_w = a3.iter().position(|a| a.kind == Kind::BackwardWeight).unwrap();
        // Its first W comes after its fourth I: the weights of 3 micro-batches deferred.
        assert_eq!(a3[first_i..first_w].iter().filter(|a| a.kind == Kind::BackwardInput).count(), 3 + 1);
    }

    #[test]
    fn zbv_runs_a_v_and_holds_about_one_stage_of_micro_batches() {
        // research §5: rank 0 runs 2·pp-1 chunk-0 forwards; peak ≈ 2·pp chunk-0 activations.
        let (pp, n) = (4, 8);
        assert_eq!(stages_of_rank(ZbvZeroBubble, pp, 2, 0), vec![0, 7]);
        assert_eq!(stages_of_rank(ZbvZeroBubble, pp, 2, 3), vec![3, 4]);
        let a = rank_actions(ZbvZeroBubble, pp, 2, n, 0).unwrap();
        complete(&a, &[0, 7], n, true);
        assert!(a[..2 * pp as usize - 1].iter().all(|x| x.stage == 0 && x.kind == Kind::Forward));
        assert_eq!(peak_in_flight(&a), 2 * pp);
        for rank in 1..pp {
            let a = rank_actions(ZbvZeroBubble, pp, 2, n, rank).unwrap();
            complete(&a, &[rank, 2 * pp - 1 - rank], n, true);
        }
        // Fewer micro-batches than 2·pp-1: PyTorch's actions beyond them are dropped.
        complete(&rank_actions(ZbvZeroBubble, pp, 2, 3, 0).unwrap(), &[0, 7], 3, true);
    }
}
