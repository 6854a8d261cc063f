//! torchmon's core, free of PyO3: the windowed accumulator behind `Stat`
//! (`stat`), the handler registry (`registry`), the bounded worker behind
//! async handlers (`worker`) and their set (`async_handlers`), the torch
//! wait counters' backend (`wait_counter`), the exit gate (`exit_gate`), the
//! fork reset (`fork`), the clocks (`clock`), the window-size rule
//! (`window`), the aggregations (`aggregation`), the per-window histogram of
//! the P aggregations (`histogram`), with floats written as Python does
//! (`decimal`), `torchmon summarize`'s reader (`summary`), and the TensorBoard event-file
//! writer (`tensorboard`). The binding
//! crate at the repository root (`torchmon._core`) is the only user;
//! docs/internals.md has the module map.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod aggregation;
pub mod async_handlers;
pub mod clock;
pub mod decimal;
pub mod exit_gate;
// Not under loom: its models run no fork, and loom's Mutex has no try_lock.
#[cfg(not(loom))]
pub mod fork;
pub mod fork_safe;
pub mod histogram;
pub mod prometheus;
pub mod prometheus_server;
pub mod recent;
pub mod registry;
pub mod stat;
pub mod summary;
// Not under loom: it writes files, and runs no model.
mod sync;
#[cfg(not(loom))]
pub mod tensorboard;
pub mod threads;
// Not under loom: its statics hold std atomics, and it runs no model.
#[cfg(not(loom))]
pub mod wait_counter;
pub mod watchdog;
pub mod window;
pub mod worker;
