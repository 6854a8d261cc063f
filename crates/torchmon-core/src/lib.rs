//! torchmon's core, free of PyO3: the windowed accumulator behind `Stat`
//! (`stat`), the handler registry (`registry`), the bounded worker behind
//! async handlers (`worker`), the exit gate (`exit_gate`), the fork reset
//! (`fork`), the clocks (`clock`), the window-size rule (`window`), the
//! aggregations (`aggregation`) and the per-window histogram of the P
//! aggregations (`histogram`). The binding crate at the repository root
//! (`torchmon._core`) is the only user; docs/internals.md has the module map.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod aggregation;
pub mod clock;
pub mod exit_gate;
// Not under loom: its models run no fork, and loom's Mutex has no try_lock.
#[cfg(not(loom))]
pub mod fork;
pub mod histogram;
pub mod prometheus;
pub mod prometheus_server;
pub mod registry;
pub mod stat;
mod sync;
pub mod window;
pub mod worker;
