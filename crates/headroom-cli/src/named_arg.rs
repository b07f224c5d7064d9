//! Command-line values for the planner's named enums: the names and help come
//! from the library ([`Named`]), so the CLI keeps no mirror of its types.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use headroom_plan::names::Named;

/// Parses one of `T`'s values by its command-line spelling; `--help` lists them.
pub fn named<T: Named>() -> impl TypedValueParser<Value = T> {
    let values = T::ALL.iter().map(|v| {
        let p = PossibleValue::new(v.arg());
        if v.help().is_empty() {
            p
        } else {
            p.help(v.help())
        }
    });
    PossibleValuesParser::new(values).try_map(|s| T::from_arg(&s).ok_or("not one of the listed values"))
}
