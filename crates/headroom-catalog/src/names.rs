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

/// Of `known`, the names nearest `name` by edit distance (Levenshtein, case ignored), where
/// near enough to be a slip: within a third of the name's length, and 3 edits at most.
pub fn nearest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let name = name.to_ascii_lowercase();
    let most = (name.chars().count() / 3).clamp(1, 3);
    let mut best: Vec<&str> = Vec::new();
    let mut least = usize::MAX;
    for k in known {
        let d = edit_distance(&name, &k.to_ascii_lowercase());
        if d > most || d > least {
            continue;
        }
        if d < least {
            least = d;
            best.clear();
        }
        if !best.contains(&k) {
            best.push(k);
        }
    }
    best
}

/// "; did you mean `a`?" (or "`a` or `b`"), or nothing where none is near.
pub fn did_you_mean(near: &[&str]) -> String {
    if near.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = near.iter().map(|n| format!("`{n}`")).collect();
    format!("; did you mean {}?", quoted.join(" or "))
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::Named;
    use crate::model::Head;

    #[test]
    fn the_nearest_names_are_a_slip_away() {
        use super::nearest;
        assert_eq!(nearest("lama-3-8b", ["llama-3-8b", "llama-3-70b", "gpt2"]), ["llama-3-8b"]);
        assert_eq!(nearest("a100", ["a100-40gb", "a100-80gb", "a10"]), ["a10"]);
        assert_eq!(nearest("h100sxm", ["h100-sxm", "h100-pcie"]), ["h100-sxm"]);
        assert!(nearest("resnet", ["llama-3-8b", "gpt2"]).is_empty());
    }

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
