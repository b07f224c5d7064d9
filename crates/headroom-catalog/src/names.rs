//! Stable names for enumerated choices: what the command line accepts and
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

/// Implements [`Named`] from a table of `value => (name, help)`. Exported because the
/// planner's choices are named the same way as the catalog's.
#[macro_export]
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
pub use crate::named;

#[cfg(test)]
mod tests {
    use super::Named;
    use crate::model::Head;

    #[test]
    fn every_name_reads_back_as_its_value() {
        for &v in Head::ALL {
            assert_eq!(Head::from_name(v.name()), Some(v), "{v:?}");
            assert_eq!(Head::from_arg(v.arg()), Some(v), "{v:?}");
        }
        assert_eq!(Head::from_name("lm"), None);
    }

    /// The names docs/JSON.md publishes.
    #[test]
    fn published_names_stay() {
        assert_eq!(Head::SeqCls.name(), "seq-cls");
        assert_eq!(Head::CausalLm.name(), "causal-lm");
    }
}
