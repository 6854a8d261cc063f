//! The exit gate: once the interpreter starts to exit, only the exiting
//! thread may start an event handler, and the exiting thread can wait until
//! no other thread is inside a dispatch. Free of PyO3.
//!
//! Why: CPython 3.11–3.13 end a thread that asks for the GIL back after
//! finalization began with `pthread_exit`. Its forced unwind runs through
//! every frame of that thread and aborts the process at the first of ours (an
//! `extern "C"` entry point aborts on unwind; a `catch_unwind` swallows the
//! unwind, and glibc then aborts). A daemon thread whose handler released the
//! GIL (any I/O does) has our dispatch frames below it. So the binding closes
//! the gate as the exiting thread's last `atexit` step: other threads skip
//! the handlers from then on (the process is about to end them; their events
//! are counted as skipped), and the exiting thread waits, with the GIL
//! released and for a bounded time, until no dispatch runs. A thread that
//! asks for the GIL after that holds no frame of ours. Skipping rather than
//! parking the late threads matters: a parked thread would keep any lock it
//! holds, and a later `atexit` handler taking that lock would hang the exit.
//! CPython 3.14 parks such threads instead of ending them (gh-87135): no
//! abort, but a handler parked mid-call loses its last write and keeps its
//! locks, so the gate is built there too.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

pub struct ExitGate {
    closed: AtomicBool,
    exiting_thread: Mutex<Option<ThreadId>>,
    /// Dispatches running now, on every thread (nested ones counted apart).
    running: AtomicUsize,
    skipped: AtomicU64,
}

impl Default for ExitGate {
    fn default() -> Self {
        Self::new()
    }
}

impl ExitGate {
    pub const fn new() -> Self {
        ExitGate {
            closed: AtomicBool::new(false),
            exiting_thread: Mutex::new(None),
            running: AtomicUsize::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Marks a dispatch as running until the guard is dropped.
    pub fn enter(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::SeqCst);
        Running {
            gate: self,
            serialised: false,
        }
    }

    /// `enter` for callers that never enter or leave concurrently with each
    /// other (the GIL serialises them): a plain load and store instead of a
    /// locked read-modify-write, with the same effect.
    #[inline]
    pub fn enter_serialised(&self) -> Running<'_> {
        let running = self.running.load(Ordering::Relaxed);
        self.running.store(running + 1, Ordering::SeqCst);
        Running {
            gate: self,
            serialised: true,
        }
    }

    /// Whether the current thread may start a handler now: always while the
    /// gate is open (one load), afterwards only the thread that closed it.
    /// A refusal is counted in `skipped`.
    #[inline]
    pub fn admits_current_thread(&self) -> bool {
        !self.closed.load(Ordering::SeqCst) || self.admits_after_close()
    }

    #[cold]
    fn admits_after_close(&self) -> bool {
        let exiting = *self
            .exiting_thread
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let admitted = exiting == Some(thread::current().id());
        if !admitted {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Closes the gate to every thread but the calling one. Closing again
    /// (from any thread) changes nothing.
    pub fn close(&self) {
        let mut exiting = self
            .exiting_thread
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if exiting.is_none() {
            *exiting = Some(thread::current().id());
        }
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits until no dispatch runs, or `timeout` passed; says which. Call it
    /// without holding what the running dispatches need (the GIL).
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.running() == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(1).min(deadline - now));
        }
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Handler calls refused since the gate closed.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// For tests: (closed, dispatches running, handler calls skipped).
    pub fn state(&self) -> (bool, usize, u64) {
        (self.is_closed(), self.running(), self.skipped())
    }
}

/// A running dispatch; dropping it (also when unwinding) ends it.
pub struct Running<'a> {
    gate: &'a ExitGate,
    serialised: bool,
}

impl Drop for Running<'_> {
    #[inline]
    fn drop(&mut self) {
        let running = &self.gate.running;
        if self.serialised {
            running.store(running.load(Ordering::Relaxed) - 1, Ordering::SeqCst);
        } else {
            running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn open_gate_admits_every_thread_and_counts_running_dispatches() {
        let gate = Arc::new(ExitGate::new());
        assert!(gate.admits_current_thread());
        let outer = gate.enter_serialised();
        let inner = gate.enter_serialised();
        assert_eq!(gate.running(), 2);
        let other = Arc::clone(&gate);
        assert!(
            thread::spawn(move || other.admits_current_thread())
                .join()
                .unwrap()
        );
        drop(inner);
        drop(outer);
        assert_eq!(gate.running(), 0);
        assert_eq!(gate.skipped(), 0);
    }

    #[test]
    fn closed_gate_admits_only_the_closing_thread() {
        let gate = Arc::new(ExitGate::new());
        gate.close();
        assert!(gate.is_closed());
        assert!(gate.admits_current_thread());
        let other = Arc::clone(&gate);
        let refused = thread::spawn(move || {
            // A second close from another thread does not take the gate over.
            other.close();
            other.admits_current_thread()
        });
        assert!(!refused.join().unwrap());
        assert!(gate.admits_current_thread());
        assert_eq!(gate.skipped(), 1);
    }

    #[test]
    fn wait_idle_returns_when_the_last_dispatch_ends() {
        let gate = Arc::new(ExitGate::new());
        let entered = Arc::new(Barrier::new(2));
        let worker = {
            let (gate, entered) = (Arc::clone(&gate), Arc::clone(&entered));
            thread::spawn(move || {
                let running = gate.enter();
                entered.wait();
                thread::sleep(Duration::from_millis(50));
                // Like a handler finishing: the next one is refused.
                let admitted = gate.admits_current_thread();
                drop(running);
                admitted
            })
        };
        entered.wait();
        gate.close();
        assert!(gate.wait_idle(Duration::from_secs(30)));
        assert_eq!(gate.running(), 0);
        assert!(!worker.join().unwrap());
        assert_eq!(gate.state(), (true, 0, 1));
    }

    #[test]
    fn wait_idle_gives_up_at_the_timeout() {
        let gate = ExitGate::new();
        let stuck = gate.enter();
        gate.close();
        let started = Instant::now();
        assert!(!gate.wait_idle(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(20));
        drop(stuck);
        assert!(gate.wait_idle(Duration::ZERO));
    }

    #[test]
    fn a_dispatch_ends_when_it_unwinds() {
        let gate = ExitGate::new();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _running = gate.enter_serialised();
            panic!("a handler's panic");
        }));
        assert!(result.is_err());
        assert_eq!(gate.running(), 0);
    }

    #[test]
    fn concurrent_enters_balance() {
        let gate = Arc::new(ExitGate::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gate = Arc::clone(&gate);
                thread::spawn(move || {
                    for _ in 0..10_000 {
                        let _running = gate.enter();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(gate.running(), 0);
    }
}
