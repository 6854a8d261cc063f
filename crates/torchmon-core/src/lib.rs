//! torchmon's core, free of PyO3: the windowed accumulator behind `Stat`
//! (`stat`), the handler registry (`registry`), the bounded worker behind
//! async handlers (`worker`), the exit gate (`exit_gate`), the clocks
//! (`clock`) and the aggregations (`aggregation`). The binding crate at the
//! repository root (`torchmon._core`) is the only user; docs/internals.md has
//! the module map.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod aggregation;
pub mod clock;
pub mod exit_gate;
pub mod registry;
pub mod stat;
mod sync;
pub mod worker;
