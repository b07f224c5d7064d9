//! `ExpandablePolicy`: PyTorch's choices with expandable segments for every
//! pool, whatever the settings say — the baseline a new policy has to beat.
//!
//! Each stream and pool grows one virtual reservation page by page, so blocks
//! tile densely instead of stranding slivers in many segments; under
//! pressure (the ladder's flush) every whole free page is unmapped.

use super::Policy;
use crate::config::AllocatorConfig;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpandablePolicy;

impl Policy for ExpandablePolicy {
    fn configure(&self, config: &mut AllocatorConfig) {
        config.expandable_segments = true;
    }
}
