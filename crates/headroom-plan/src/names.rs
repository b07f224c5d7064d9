//! Stable names for the planner's choices: what the command line accepts and
//! what `--json` prints (docs/JSON.md). A name, once published, does not
//! change; `Debug` names are for developers and may.

/// An enum whose values have stable, documented names.
pub trait Named: Copy + Send + Sync + 'static {
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];

    /// The value's name.
    fn name(self) -> &'static str;

    /// One line for `--help`, where the name needs one.
    fn help(self) -> &'static str {
        ""
    }

    /// How the command line spells it, where that differs from the name.
    fn arg(self) -> &'static str {
        self.name()
    }

    /// The value with this name.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }

    /// The value the command line spells this way.
    fn from_arg(arg: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.arg() == arg)
    }
}

/// Implements [`Named`] from a table of `value => (name, help)`.
macro_rules! named {
    ($t:ty { $($v:ident => ($name:literal, $help:literal)),+ $(,)? }) => {
        impl $crate::names::Named for $t {
            const ALL: &'static [Self] = &[$(<$t>::$v),+];
            fn name(self) -> &'static str {
                match self { $(<$t>::$v => $name),+ }
            }
            fn help(self) -> &'static str {
                match self { $(<$t>::$v => $help),+ }
            }
        }
    };
}
pub(crate) use named;

#[cfg(test)]
mod tests {
    use super::Named;
    use crate::emit::Engine;
    use crate::infer::WeightFormat;
    use crate::job::{Attention, Framework, LoraTargets, Offload, Optimizer, PipelineStage, Precision};
    use crate::model::Head;

    fn round_trips<T: Named + PartialEq + std::fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(T::from_name(v.name()), Some(v), "{v:?}");
            assert_eq!(T::from_arg(v.arg()), Some(v), "{v:?}");
        }
        let mut names: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), T::ALL.len(), "names are distinct");
    }

    #[test]
    fn every_name_reads_back_as_its_value() {
        round_trips::<Precision>();
        round_trips::<Optimizer>();
        round_trips::<Attention>();
        round_trips::<Framework>();
        round_trips::<Head>();
        round_trips::<Offload>();
        round_trips::<LoraTargets>();
        round_trips::<PipelineStage>();
        round_trips::<Engine>();
        round_trips::<WeightFormat>();
    }

    /// The names docs/JSON.md publishes.
    #[test]
    fn published_names_stay() {
        assert_eq!(Precision::Mixed.name(), "mixed");
        assert_eq!(Optimizer::Adam8bit.name(), "adam8bit");
        assert_eq!(Optimizer::SgdMomentum.name(), "sgd-momentum");
        assert_eq!(Attention::Sdpa.name(), "sdpa");
        assert_eq!(Framework::HuggingFace.name(), "hf");
        assert_eq!(Offload::OptimizerAndParams.name(), "optimizer+params");
        assert_eq!(Offload::OptimizerAndParams.arg(), "params");
        assert_eq!(PipelineStage::Only.name(), "only");
        assert_eq!(Head::SeqCls.name(), "seq-cls");
    }
}
