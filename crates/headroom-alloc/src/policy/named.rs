//! Policies by name, for settings read at run time (`headroom replay
//! --policy NAME`): [`PolicyName`] parses and lists them, [`NamedPolicy`]
//! holds the chosen one and forwards to it with one `match` per decision.

use super::{
    CachedSegment, ExpandableFit, ExpandablePolicy, HeadroomPolicy, LifetimePolicy, Placement, PlannedPolicy, Policy,
    PyTorchPolicy, Rung, TightPolicy,
};
use crate::config::AllocatorConfig;
use crate::device::StreamId;
use crate::stats::PoolKind;
use std::fmt;
use std::str::FromStr;

/// A policy headroom ships, by the name users type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyName {
    PyTorch,
    Expandable,
    Headroom,
    Tight,
    Lifetime,
    Planned,
}

impl PolicyName {
    /// Every policy, the default first.
    pub const ALL: [PolicyName; 6] = [
        PolicyName::PyTorch,
        PolicyName::Expandable,
        PolicyName::Headroom,
        PolicyName::Tight,
        PolicyName::Lifetime,
        PolicyName::Planned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyName::PyTorch => "pytorch",
            PolicyName::Expandable => "expandable",
            PolicyName::Headroom => "headroom",
            PolicyName::Tight => "tight",
            PolicyName::Lifetime => "lifetime",
            PolicyName::Planned => "planned",
        }
    }

    /// One line on what the policy does.
    pub fn describe(self) -> &'static str {
        match self {
            PolicyName::PyTorch => "PyTorch's caching allocator, decision for decision (the default)",
            PolicyName::Expandable => "PyTorch's, with expandable segments for every pool",
            PolicyName::Headroom => {
                "expandable, and whole free pages reused before reserved memory passes its peak, but not the pages the run maps again"
            }
            PolicyName::Tight => {
                "headroom's, giving back every free page before the peak grows: the lowest peak, for device calls every step"
            }
            PolicyName::Lifetime => "headroom's, with sizes seen to live long placed apart from the short-lived",
            PolicyName::Planned => {
                "headroom's, and once a step repeats, its blocks at offsets packed ahead in one arena"
            }
        }
    }

    pub fn build(self) -> NamedPolicy {
        match self {
            PolicyName::PyTorch => NamedPolicy::PyTorch(PyTorchPolicy),
            PolicyName::Expandable => NamedPolicy::Expandable(ExpandablePolicy),
            PolicyName::Headroom => NamedPolicy::Headroom(HeadroomPolicy),
            PolicyName::Tight => NamedPolicy::Tight(TightPolicy),
            PolicyName::Lifetime => NamedPolicy::Lifetime(Box::default()),
            PolicyName::Planned => NamedPolicy::Planned(Box::default()),
        }
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a policy's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (known: pytorch, expandable, headroom, tight, lifetime, planned)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyName {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyName::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s)).ok_or_else(|| UnknownPolicy(s.into()))
    }
}

/// One of the policies headroom ships, chosen at run time. The ones that learn carry
/// their state behind a box, so the others stay a word wide.
#[derive(Clone, Debug)]
pub enum NamedPolicy {
    PyTorch(PyTorchPolicy),
    Expandable(ExpandablePolicy),
    Headroom(HeadroomPolicy),
    Tight(TightPolicy),
    Lifetime(Box<LifetimePolicy>),
    Planned(Box<PlannedPolicy>),
}

impl NamedPolicy {
    pub fn name(&self) -> PolicyName {
        match self {
            NamedPolicy::PyTorch(_) => PolicyName::PyTorch,
            NamedPolicy::Expandable(_) => PolicyName::Expandable,
            NamedPolicy::Headroom(_) => PolicyName::Headroom,
            NamedPolicy::Tight(_) => PolicyName::Tight,
            NamedPolicy::Lifetime(_) => PolicyName::Lifetime,
            NamedPolicy::Planned(_) => PolicyName::Planned,
        }
    }
}

macro_rules! forward {
    ($self:ident, $p:ident => $call:expr) => {
        match $self {
            NamedPolicy::PyTorch($p) => $call,
            NamedPolicy::Expandable($p) => $call,
            NamedPolicy::Headroom($p) => $call,
            NamedPolicy::Tight($p) => $call,
            NamedPolicy::Lifetime($p) => $call,
            NamedPolicy::Planned($p) => $call,
        }
    };
}

impl Policy for NamedPolicy {
    #[inline]
    fn may_serve(&self, config: &AllocatorConfig, rounded: u64, block_size: u64) -> bool {
        forward!(self, p => p.may_serve(config, rounded, block_size))
    }
    fn ladder(&self) -> &[Rung] {
        forward!(self, p => p.ladder())
    }
    fn garbage_target(&self, config: &AllocatorConfig, reserved: u64, limit: Option<u64>) -> Option<u64> {
        forward!(self, p => p.garbage_target(config, reserved, limit))
    }
    fn pick_garbage(&self, target: u64, candidates: &[CachedSegment]) -> Vec<usize> {
        forward!(self, p => p.pick_garbage(target, candidates))
    }
    fn flush_order(&self) -> [PoolKind; 2] {
        forward!(self, p => p.flush_order())
    }
    fn configure(&self, config: &mut AllocatorConfig) {
        forward!(self, p => p.configure(config))
    }
    fn page_size(&self, config: &AllocatorConfig, pool: PoolKind) -> u64 {
        forward!(self, p => p.page_size(config, pool))
    }
    fn map_ahead(&self, config: &AllocatorConfig, pool: PoolKind, size: u64, room: u64) -> u64 {
        forward!(self, p => p.map_ahead(config, pool, size, room))
    }
    fn climb_ahead(&self, config: &AllocatorConfig, pool: PoolKind, reserved: u64) -> u64 {
        forward!(self, p => p.climb_ahead(config, pool, reserved))
    }
    fn expandable_fit(&self) -> ExpandableFit {
        forward!(self, p => p.expandable_fit())
    }
    fn keep_budget(&self, peak: u64) -> u64 {
        forward!(self, p => p.keep_budget(peak))
    }
    fn reclaim_rule(&self, config: &AllocatorConfig) -> crate::policy::ReclaimRule {
        forward!(self, p => p.reclaim_rule(config))
    }
    fn allocation_size(&self, config: &AllocatorConfig, pool: PoolKind, climbing: bool) -> u64 {
        forward!(self, p => p.allocation_size(config, pool, climbing))
    }
    #[inline]
    fn place(&mut self, rounded: u64, stream: StreamId) -> Placement {
        forward!(self, p => p.place(rounded, stream))
    }
    #[inline]
    fn stream_of(&self, placement: StreamId) -> StreamId {
        forward!(self, p => p.stream_of(placement))
    }
    #[inline]
    fn on_alloc(&mut self, ptr: u64, size: u64, placed: StreamId) {
        forward!(self, p => p.on_alloc(ptr, size, placed))
    }
    #[inline]
    fn on_free(&mut self, ptr: u64) {
        forward!(self, p => p.on_free(ptr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for p in PolicyName::ALL {
            assert_eq!(p.name().parse::<PolicyName>(), Ok(p));
            assert_eq!(p.build().name(), p);
        }
        assert_eq!("HEADROOM".parse::<PolicyName>(), Ok(PolicyName::Headroom));
        let e = "best".parse::<PolicyName>().unwrap_err();
        assert!(e.to_string().contains("unknown policy `best`"), "{e}");
    }
}
