//! torchmon's core, free of PyO3. Its modules, by what they serve:
//!
//! - `Stat`: the windowed accumulator (`stat`), its aggregations
//!   (`aggregation`), the per-window histogram of the P aggregations
//!   (`histogram`), the window-size rule (`window`), the clocks (`clock`),
//!   the atomics and lock it is built on (`sync`);
//! - delivery: the handler registry (`registry`), the bounded worker
//!   (`worker`) behind async handlers (`async_handlers`), the torch wait
//!   counters' backend (`wait_counter`);
//! - the process's life: the exit gate (`exit_gate`), the fork reset
//!   (`fork`) and the locks a forked child replaces (`fork_safe`), the
//!   core's threads (`threads`);
//! - sinks and readers: Prometheus's exposition, with its scrape
//!   negotiation and server (`prometheus`), the TensorBoard event-file
//!   writer (`tensorboard`), `torchmon summarize`'s reader (`summary`),
//!   floats written as Python does (`decimal`), the last few values of a
//!   key (`recent`), the protobuf writer of the sinks that write protobuf
//!   (`wire`);
//! - the hang watchdog (`watchdog`).
//!
//! The binding crate at the repository root (`torchmon._core`) is the only
//! user; docs/internals.md has the module map, with what each module uses
//! (checked by tests/api/test_module_map.py).
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
mod wire;
pub mod worker;
