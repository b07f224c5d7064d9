//! How a training job spreads over GPUs: data, tensor, pipeline and context
//! parallel degrees, where their groups fall on nodes, and what their
//! collectives cost (research/estimation.md §8.3).
//!
//! Ranks are laid out in Megatron's order — tensor innermost, then context,
//! then data, then pipeline — so a group of size n whose members are `stride`
//! ranks apart spans n × stride consecutive ranks. A group that fits in one
//! node of [`GPUS_PER_NODE`] runs at the GPU-to-GPU link; one that spans
//! nodes is limited by each GPU's share of the network, [`INTER_NODE_BANDWIDTH`].

use crate::gpu::GpuSpec;
use crate::model::Model;
pub use crate::pipelining::{PipelineSchedule, StageOutputs};

/// GPUs per node (HGX/DGX boards).
pub const GPUS_PER_NODE: u64 = 8;

/// NCCL's buffers and communicator state on each GPU of a multi-GPU job (research/estimation.md §4.1).
pub const NCCL_BYTES: f64 = 1.5 * (1u64 << 30) as f64;

/// Network bandwidth per GPU between nodes, per direction: one 400 Gb/s NIC
/// per GPU (research/estimation.md §8.3: 8 × 50 GB/s EFA per B200 node).
pub const INTER_NODE_BANDWIDTH: f64 = 50e9;

/// Fraction of a link's bandwidth that large collectives reach
/// (research/estimation.md §8.3: all-reduce bus bandwidth 78–82% of the link;
/// 70% leaves room for the medium-sized messages a step also sends).
pub const LINK_EFFICIENCY: f64 = 0.7;

/// The parallel layout of a training job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    /// Data-parallel replicas (the ZeRO/FSDP sharding group).
    pub data: u64,
    /// Tensor-parallel ranks (Megatron: attention heads and MLP columns split).
    pub tensor: u64,
    /// Pipeline stages.
    pub pipeline: u64,
    /// Context-parallel ranks (the sequence split, ring attention).
    pub context: u64,
    /// Megatron's sequence parallelism: with tensor parallelism, also split
    /// the norms' and dropouts' activations along the sequence.
    pub sequence_parallel: bool,
    /// Model chunks per pipeline stage: 1 is 1F1B, more is interleaved 1F1B.
    pub virtual_stages: u64,
    /// PyTorch's pipeline schedule (under torchtitan); `Schedule1F1B` with more than one
    /// chunk per stage stands for the interleaved schedule ([`Parallelism::pipeline_schedule`]).
    pub schedule: PipelineSchedule,
    /// What each pipeline stage keeps of its outputs for the step (under torchtitan).
    pub stage_outputs: StageOutputs,
    /// Transformer Engine's userbuffer overlap of the tensor-parallel
    /// all-gathers and reduce-scatters with the GEMMs (Megatron's
    /// `--tp-comm-overlap`; needs sequence parallelism).
    pub tp_comm_overlap: bool,
    /// ZeRO stage over the data-parallel group, 0–3 (FSDP: 2 = SHARD_GRAD_OP, 3 = FULL_SHARD).
    pub zero_stage: u8,
    /// HSDP under torchtitan: replicas of the FSDP group among the data-parallel GPUs
    /// (`data_parallel_replicate_degree`); each shards the model states over the rest
    /// ([`Parallelism::shard_degree`]). 1: FSDP over every data-parallel GPU.
    pub replicate: u64,
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            data: 1,
            tensor: 1,
            pipeline: 1,
            context: 1,
            sequence_parallel: true,
            virtual_stages: 1,
            schedule: PipelineSchedule::Schedule1F1B,
            stage_outputs: StageOutputs::None,
            tp_comm_overlap: false,
            zero_stage: 0,
            replicate: 1,
        }
    }
}

impl Parallelism {
    /// Plain data parallelism over `gpus` with a ZeRO stage.
    pub fn data_parallel(gpus: u64, zero_stage: u8) -> Parallelism {
        Parallelism { data: gpus, zero_stage, ..Parallelism::default() }
    }

    /// The GPUs a ZeRO stage shards the model states over: the data-parallel GPUs and, with
    /// context parallelism, those too (each computes the gradients of its part of the
    /// sequence), as FSDP2 shards over torchtitan's `dp_shard × cp` mesh, Megatron's
    /// distributed optimizer over its data-and-context group, and DeepSpeed over its
    /// sequence-data group. HSDP's replicas ([`Parallelism::replicate`]) each hold the whole
    /// model states, sharded over their own group only: one replica per GPU shards nothing.
    pub fn shard_degree(&self) -> u64 {
        (self.data.max(1) / self.replicate.max(1)).max(1) * self.context.max(1)
    }

    /// The schedule that runs the pipeline: the one named, or interleaved 1F1B where more
    /// than one chunk per stage was asked for without one.
    pub fn pipeline_schedule(&self) -> PipelineSchedule {
        if self.schedule == PipelineSchedule::Schedule1F1B && self.virtual_stages > 1 {
            PipelineSchedule::Interleaved1F1B
        } else {
            self.schedule
        }
    }

    /// GPUs in the job.
    pub fn gpus(&self) -> u64 {
        self.data * self.tensor * self.pipeline * self.context
    }

    /// Model-parallel GPUs one replica spans.
    pub fn model_parallel(&self) -> u64 {
        self.tensor * self.pipeline * self.context
    }

    /// Whether the layout can run `model` on sequences of `seq` tokens; the
    /// reason if not.
    pub fn check(&self, model: &Model, seq: u64) -> Result<(), crate::InvalidConfig> {
        self.why_not(model, seq, true).map_err(crate::InvalidConfig)
    }

    /// [`Parallelism::check`] with `even_chunks` false for torchtitan, which splits the
    /// layers over the stages unevenly (`_generate_llm_fqn_per_model_part`) where
    /// Megatron's interleaved schedule needs them divisible.
    pub(crate) fn why_not(&self, model: &Model, seq: u64, even_chunks: bool) -> Result<(), String> {
        let (t, p, c, v) = (self.tensor, self.pipeline, self.context, self.virtual_stages);
        if self.data == 0 || t == 0 || p == 0 || c == 0 || v == 0 || self.replicate == 0 {
            return Err("parallel degrees must be positive".into());
        }
        if !self.data.is_multiple_of(self.replicate) {
            return Err(format!(
                "{} HSDP replicas do not divide the {} data-parallel GPUs (--dp-replicate must divide them)",
                self.replicate, self.data
            ));
        }
        if !model.heads.is_multiple_of(t) {
            return Err(format!("tensor parallelism {t} does not divide the {} attention heads", model.heads));
        }
        if !model.kv_heads.is_multiple_of(t) {
            // Megatron splits key-value groups over the tensor-parallel ranks (num_query_groups % tp == 0).
            return Err(format!(
                "tensor parallelism {t} does not divide the {} key-value heads (Megatron needs whole groups per GPU)",
                model.kv_heads
            ));
        }
        if !model.intermediate.is_multiple_of(t) {
            return Err(format!("tensor parallelism {t} does not divide the MLP width {}", model.intermediate));
        }
        let schedule = self.pipeline_schedule();
        if schedule != PipelineSchedule::Schedule1F1B && p == 1 {
            return Err(format!(
                "the {} pipeline schedule needs more than one pipeline stage (--pp)",
                schedule.class()
            ));
        }
        if schedule.looped() && v < 2 {
            // torchtitan: "Multi-stage schedule requires at least 2 stages per rank".
            return Err(format!(
                "the {} schedule runs at least 2 stages per rank; --vpp {v} gives one (use 1f1b, or --vpp 2 or more)",
                schedule.class()
            ));
        }
        if schedule == PipelineSchedule::ZbvZeroBubble && v != 2 {
            return Err(format!("the ZBVZeroBubble schedule runs exactly 2 stages per rank, not {v}"));
        }
        if p * v > model.layers {
            return Err(format!(
                "{p} pipeline stages × {v} chunks need at least as many layers; {} has {}",
                model.name, model.layers
            ));
        }
        if v > 1 && (p == 1 || even_chunks && !model.layers.is_multiple_of(p * v)) {
            return Err(format!(
                "the interleaved schedule needs more than one stage and layers ({}) divisible by stages × chunks ({})",
                model.layers,
                p * v
            ));
        }
        if !seq.is_multiple_of(c) {
            return Err(format!("context parallelism {c} does not divide the sequence of {seq} tokens"));
        }
        if self.tp_comm_overlap && (t == 1 || !self.sequence_parallel) {
            return Err(
                "tensor-parallel communication overlap needs tensor parallelism with sequence parallelism".into()
            );
        }
        if self.zero_stage > 3 {
            return Err(format!("ZeRO stage {} does not exist (0–3)", self.zero_stage));
        }
        Ok(())
    }

    fn group_bandwidth(gpu: &GpuSpec, size: u64, stride: u64) -> f64 {
        if size * stride <= GPUS_PER_NODE {
            gpu.link_bandwidth
        } else {
            gpu.link_bandwidth.min(INTER_NODE_BANDWIDTH)
        }
    }

    /// Per-direction bandwidth of the tensor-parallel group.
    pub fn tensor_bandwidth(&self, gpu: &GpuSpec) -> f64 {
        Self::group_bandwidth(gpu, self.tensor, 1)
    }

    /// Per-direction bandwidth of the context-parallel group.
    pub fn context_bandwidth(&self, gpu: &GpuSpec) -> f64 {
        Self::group_bandwidth(gpu, self.context, self.tensor)
    }

    /// Per-direction bandwidth of the group that reduces gradients and shards the states
    /// ([`Parallelism::shard_degree`]: context ranks sit next to each other, data ranks
    /// outside them).
    pub fn data_bandwidth(&self, gpu: &GpuSpec) -> f64 {
        Self::group_bandwidth(gpu, self.shard_degree(), self.tensor)
    }

    /// Per-direction bandwidth between neighbouring pipeline stages.
    pub fn pipeline_bandwidth(&self, gpu: &GpuSpec) -> f64 {
        Self::group_bandwidth(gpu, 2, self.tensor * self.context * self.data)
    }
}

/// Seconds for a ring all-reduce of `bytes` over `n` ranks: each rank sends
/// and receives 2(n−1)/n of the buffer.
pub fn all_reduce(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    2.0 * (n - 1) as f64 / n as f64 * bytes / (bandwidth * LINK_EFFICIENCY)
}

/// Seconds for a ring all-gather (or reduce-scatter) whose full buffer is
/// `bytes`: each rank receives (n−1)/n of it.
pub fn all_gather(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    (n - 1) as f64 / n as f64 * bytes / (bandwidth * LINK_EFFICIENCY)
}

/// Seconds to send `bytes` point to point.
pub fn send(bytes: f64, bandwidth: f64) -> f64 {
    bytes / (bandwidth * LINK_EFFICIENCY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::gpu;
    use crate::model::preset;

    #[test]
    fn groups_inside_a_node_use_nvlink_and_spanning_groups_the_network() {
        let h100 = gpu("h100-sxm").unwrap();
        let p = Parallelism { data: 64, tensor: 8, pipeline: 16, ..Parallelism::default() };
        assert_eq!(p.gpus(), 8192);
        assert_eq!(p.tensor_bandwidth(&h100), 4.5e11);
        assert_eq!(p.data_bandwidth(&h100), INTER_NODE_BANDWIDTH);
        let small = Parallelism { data: 4, tensor: 2, ..Parallelism::default() };
        assert_eq!(small.data_bandwidth(&h100), 4.5e11);
        // A ring all-reduce moves 2(n−1)/n of the buffer; all-gather half that.
        let ar = all_reduce(1e9, 8, 1e9);
        assert!((ar - 2.0 * 7.0 / 8.0 / LINK_EFFICIENCY).abs() < 1e-12);
        assert!((all_gather(1e9, 8, 1e9) * 2.0 - ar).abs() < 1e-12);
        assert_eq!(all_reduce(1e9, 1, 1e9), 0.0);
    }

    #[test]
    fn layouts_the_model_cannot_take_are_named() {
        let m = preset("llama-2-7b").unwrap();
        let bad = |p: Parallelism, seq| p.check(&m, seq).unwrap_err().0;
        assert!(bad(Parallelism { tensor: 3, ..Default::default() }, 4096).contains("32 attention heads"));
        assert!(bad(Parallelism { pipeline: 64, ..Default::default() }, 4096).contains("has 32"));
        assert!(bad(Parallelism { pipeline: 4, virtual_stages: 3, ..Default::default() }, 4096).contains("divisible"));
        assert!(bad(Parallelism { context: 3, ..Default::default() }, 4096).contains("4096 tokens"));
        assert!(Parallelism { tensor: 8, pipeline: 4, virtual_stages: 2, context: 2, ..Default::default() }
            .check(&m, 4096)
            .is_ok());
    }
}
