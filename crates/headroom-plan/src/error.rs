//! The planner's errors, split by what the caller can do: change the
//! configuration ([`InvalidConfig`]), pick a known GPU ([`crate::UnknownGpu`]), or
//! ask another engine for its configuration ([`CannotEmit`]). Reading a model's
//! config has its own, [`crate::model::ModelError`].

/// A configuration the planner cannot estimate, with the reason: a layout the model
/// does not divide into, a feature the GPU lacks, options that exclude each other.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidConfig(pub String);

/// A configuration the asked-for engine cannot express, and what to use instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CannotEmit(pub String);
