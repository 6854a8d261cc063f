//! What runs at exit, at `flush()` and around a fork, over the core's one
//! list of live Stats (`torchmon_core::stat::live`): each Stat's window is
//! emitted by its owner, a Python `Stat` (`py_stat`) or a torch wait counter
//! (`py_torch_wait_counters`). The package registers these functions, in
//! the order python/torchmon/__init__.py gives (docs/internals.md, "Exit").

use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use crate::py_registry::Failures;
use crate::py_stat::{StatShared, WindowOwner};
use crate::py_torch_wait_counters as wait_counters;
use torchmon_core::stat::{Stat as CoreStat, live};
use torchmon_core::wait_counter::Counter;

/// How long `flush()` waits for the wait-counter delivery thread's dispatch
/// in progress.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// How long the exit step waits for it.
const EXIT_WAIT: Duration = Duration::from_secs(2);

fn owner_of(stat: &CoreStat) -> Option<Arc<dyn WindowOwner>> {
    if let Some(owner) = stat.owner::<StatShared>() {
        return Some(owner);
    }
    Some(stat.owner::<Counter>()?)
}

/// Emits the open window of every live Stat, in creation order, each by its
/// owner; a Stat no Python object owns (one made in Rust) has nobody to
/// emit it. Calls `failed` with each handler error and the Stat's name.
/// Returns how many windows were emitted.
fn emit_open_windows(py: Python<'_>, mut failed: impl FnMut(PyErr, Bound<'_, PyAny>)) -> usize {
    let mut emitted = 0;
    for stat in live::all() {
        let Some(owner) = owner_of(&stat) else {
            continue;
        };
        if let Some(window) = stat.flush() {
            emitted += 1;
            if let Err(err) = owner.emit_window(py, &window) {
                failed(err, owner.name(py));
            }
        }
    }
    emitted
}

/// Emits the open window of every live Stat now; the Stats go on with a new
/// window. `torchmon.flush()`'s first step (docs/api.md): first the windows
/// the wait counters' delivery thread has not dispatched yet (they closed
/// earlier), then every open one in creation order. Every Stat is flushed
/// even when a handler raises; the first error is raised afterwards by the
/// rule of `log_event` (`py_registry::Failures`). Returns how many windows
/// were emitted.
#[pyfunction]
pub fn _flush_stats_now(py: Python<'_>) -> PyResult<usize> {
    let mut failures = Failures::default();
    let mut emitted = wait_counters::emit_queued(py, &mut failures, FLUSH_WAIT);
    emitted += emit_open_windows(py, |err, name| failures.add(py, err, &name));
    failures.into_result().map(|()| emitted)
}

/// The exit step (registered with `atexit` by the package): stops the wait
/// counters' delivery, emits what it had queued and every open window, with
/// handler errors reported as unraisable; from then on Stats destroyed stay
/// quiet and windows torch closes are dropped, Python untouched.
#[pyfunction]
pub fn _flush_all_stats(py: Python<'_>) {
    wait_counters::stop_delivery();
    let mut failures = Failures::default();
    wait_counters::emit_queued(py, &mut failures, EXIT_WAIT);
    if let Err(err) = failures.into_result() {
        err.write_unraisable(py, None);
    }
    emit_open_windows(py, |err, name| {
        let context = format!("torchmon.Stat({name}) flushing its window at interpreter exit");
        crate::py_convert::write_unraisable(py, err, &context);
    });
    crate::py_stat::mark_exited();
    wait_counters::finish_exit(py);
}

/// In a forked child: empties the open window of every live core Stat
/// (Python's, WaitCounters', torch's wait counters' and any made in Rust),
/// which holds the parent's samples, so that the child emits only what it
/// adds itself, gives the torch wait counters a new delivery queue, then
/// runs the core's child hooks. Registered with `os.register_at_fork`
/// by the package. Returns how many windows were discarded.
#[pyfunction]
pub fn _reset_stats_after_fork() -> usize {
    torchmon_core::fork::after_fork_in_child()
}

/// For tests: how many Stats are alive.
#[pyfunction]
pub fn _live_stat_count() -> usize {
    live::count()
}
