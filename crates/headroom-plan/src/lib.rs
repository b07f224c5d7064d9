//! # headroom-plan
//!
//! Planning GPU memory before a run. This crate holds, so far, the
//! activation-checkpointing solver: given a chain of layers with their
//! forward and backward times and memory, and a memory budget, the schedule
//! of forwards, recomputations and backwards that fits and takes the least
//! time ([`checkpoint`]). The training and inference memory model that will
//! use it (`headroom plan`) is a separate piece of work.

pub mod checkpoint;
