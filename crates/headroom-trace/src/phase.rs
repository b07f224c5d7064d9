//! The part of a training or inference step an allocation belongs to, and one value for each
//! phase of a training step.
//!
//! One vocabulary for every reader of steps: the inspector names the phase of a recorded
//! allocation from its frames, the recorded step ([`crate::recorded_step`]) cuts a trace into
//! steps by them, and the planner's step program marks where its own phases begin (it uses
//! setup and the three phases of a step only). The optimizer's phase is named as PyTorch names
//! the call, `optimizer.step()`.

use serde::Serialize;
use std::fmt;

/// The part of a training or inference step an allocation was made in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Building the model, the optimizer and the inputs, moving them to the GPU, loading
    /// weights: before the first step.
    Setup,
    DataLoading,
    Forward,
    Backward,
    /// `optimizer.step()`, and `zero_grad` after it.
    OptimizerStep,
    Evaluation,
    /// Frames that name no phase (the user's own code between the model's calls).
    Other,
    /// No frames were recorded: the autograd engine's thread when recorded with Python
    /// stacks only.
    Unknown,
}

impl Phase {
    /// The phases of a training step, in the order they run.
    pub const STEP: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::OptimizerStep];

    /// The stable name JSON, text and the dumped trace use.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::DataLoading => "data_loading",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::OptimizerStep => "optimizer_step",
            Phase::Evaluation => "evaluation",
            Phase::Other => "other",
            Phase::Unknown => "unknown",
        }
    }
}

/// In words, for sentences ("step 2's optimizer step").
impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::DataLoading => "data loading",
            Phase::OptimizerStep => "optimizer step",
            other => other.name(),
        })
    }
}

/// One value for each phase of a training step: its forward, its backward and its optimizer
/// step. The phases outside a step (setup, data loading, …) have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByPhase<T> {
    pub forward: T,
    pub backward: T,
    pub optimizer_step: T,
}

impl<T> ByPhase<T> {
    /// `phase`'s value; `None` for a phase outside a step.
    pub fn get(&self, phase: Phase) -> Option<&T> {
        match phase {
            Phase::Forward => Some(&self.forward),
            Phase::Backward => Some(&self.backward),
            Phase::OptimizerStep => Some(&self.optimizer_step),
            _ => None,
        }
    }

    /// `phase`'s value; `None` for a phase outside a step.
    pub fn get_mut(&mut self, phase: Phase) -> Option<&mut T> {
        match phase {
            Phase::Forward => Some(&mut self.forward),
            Phase::Backward => Some(&mut self.backward),
            Phase::OptimizerStep => Some(&mut self.optimizer_step),
            _ => None,
        }
    }

    /// Each phase with its value, in the order they run.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, &T)> {
        [
            (Phase::Forward, &self.forward),
            (Phase::Backward, &self.backward),
            (Phase::OptimizerStep, &self.optimizer_step),
        ]
        .into_iter()
    }

    /// Each value through `f`.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> ByPhase<U> {
        ByPhase { forward: f(self.forward), backward: f(self.backward), optimizer_step: f(self.optimizer_step) }
    }
}

impl<T: Copy + PartialOrd> ByPhase<T> {
    /// Raises `phase`'s value to `value` where that is higher (nothing for a phase outside a
    /// step): a phase's peak.
    pub fn raise(&mut self, phase: Phase, value: T) {
        if let Some(slot) = self.get_mut(phase) {
            if value > *slot {
                *slot = value;
            }
        }
    }

    /// The highest of the three.
    pub fn max(&self) -> T {
        let mut best = self.forward;
        for v in [self.backward, self.optimizer_step] {
            if v > best {
                best = v;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_sentences_read() {
        assert_eq!(Phase::OptimizerStep.name(), "optimizer_step");
        assert_eq!(Phase::OptimizerStep.to_string(), "optimizer step");
        assert_eq!(Phase::DataLoading.to_string(), "data loading");
        assert_eq!(Phase::Forward.to_string(), "forward");
        assert_eq!(serde_json::to_string(&Phase::OptimizerStep).unwrap(), "\"optimizer_step\"");
    }

    #[test]
    fn only_a_steps_phases_hold_values() {
        let mut p = ByPhase::<u64>::default();
        p.raise(Phase::Backward, 7);
        p.raise(Phase::Backward, 3);
        p.raise(Phase::Setup, 100);
        p.raise(Phase::Unknown, 100);
        assert_eq!((p.forward, p.backward, p.optimizer_step), (0, 7, 0));
        assert_eq!(p.max(), 7);
        assert_eq!(p.get(Phase::Evaluation), None);
        assert_eq!(p.iter().map(|(ph, _)| ph).collect::<Vec<_>>(), Phase::STEP);
        assert_eq!(p.map(|v| v * 2).backward, 14);
    }
}
