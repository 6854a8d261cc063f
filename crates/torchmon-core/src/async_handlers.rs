//! The set of async handlers (behind `AsyncEventHandler`), free of PyO3:
//! each one a `worker::Worker` plus what it was made with, generic over the
//! item `T` its worker delivers and the handler `H` its worker calls (the
//! binding's Python callable, which it needs to start a worker).
//!
//! What the set keeps, for the exit and fork steps (docs/internals.md, "Exit"
//! and "Fork"):
//! - the live handlers, in creation order, for the exit drain, the drain of
//!   `flush()` and the fork restart;
//! - the threads of handlers dropped while their queue still drained
//!   ("orphans"), joined by the exit drain, so that none touches a finalizing
//!   interpreter. Those that ended are joined whenever another is added: a
//!   thread ended but not joined keeps its stack mapped, and enough of them
//!   (tens of thousands of handlers dropped without `close()`) leave the
//!   process unable to start a thread (docs/reliability.md);
//! - whether the exit drain ran: handlers made later start closed, and then
//!   hand every item back to the caller ("synchronous"), as do the handlers
//!   the exit drain closed;
//! - in a forked child, each handler gets a new queue and thread; the old
//!   worker is leaked: its thread does not exist there, and its locks may
//!   have been held by it at fork time. The items it held are the parent's
//!   to deliver.
//!
//! Every wait goes through the caller's `wait`, which calls a `Step` (a wait
//! of at most `SLICE`) until it returns `true`: the binding detaches from
//! Python around each step and checks for signals (Ctrl-C) between them, and
//! an error from that check ends the wait.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::worker::{Flush, Pushed, Worker};

/// The longest one step of a wait lasts, so that signals are seen.
pub const SLICE: Duration = Duration::from_millis(50);

/// The largest `maxsize`: the queue's memory is allocated up front (about 24
/// bytes an item).
pub const MAX_QUEUE: usize = 1 << 22;

/// One step of a wait: waits at most `SLICE`; `true` once done.
pub type Step<'a> = dyn FnMut() -> bool + Send + 'a;

/// What a full queue does with an offered item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFull {
    Drop,
    Block,
}

impl OnFull {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFull::Drop => "drop",
            OnFull::Block => "block",
        }
    }

    pub fn parse(text: &str) -> Option<OnFull> {
        match text {
            "drop" => Some(OnFull::Drop),
            "block" => Some(OnFull::Block),
            _ => None,
        }
    }
}

/// The `maxsize` of a handler made without one.
pub const DEFAULT_MAXSIZE: usize = 1024;

/// The `maxsize` rule: 1 to `MAX_QUEUE` (`None`: an int past `i64`). The
/// problem is worded to follow the argument's name; `repr` writes the
/// argument as Python does.
pub fn check_maxsize(value: Option<i64>, repr: impl FnOnce() -> String) -> Result<usize, String> {
    match value.map(usize::try_from) {
        Some(Ok(n)) if (1..=MAX_QUEUE).contains(&n) => Ok(n),
        _ => Err(format!("must be between 1 and {MAX_QUEUE}, got {}", repr())),
    }
}

/// The `on_full` rule: "drop" or "block"; the problem as for `check_maxsize`.
pub fn check_on_full(text: &str) -> Result<OnFull, String> {
    OnFull::parse(text).ok_or_else(|| format!("must be \"drop\" or \"block\", got {text:?}"))
}

/// The `RuntimeError` message of a handler whose worker thread cannot start.
pub fn worker_start_message(err: impl std::fmt::Display) -> String {
    format!("AsyncEventHandler: cannot start its worker thread: {err}")
}

/// The `RuntimeError` message of `flush()` or `close()` (`method`) called
/// from the handler's own worker thread, which would wait for itself.
pub fn own_thread_message(method: &str) -> String {
    format!("AsyncEventHandler.{method}() called from its own handler would wait for itself")
}

/// `timeout` seconds from now: `None` (no limit) for a time too long to
/// represent; the problem, for a negative or NaN one, as for `check_maxsize`.
pub fn deadline_in(seconds: f64) -> Result<Option<Instant>, String> {
    if seconds.is_nan() || seconds < 0.0 {
        return Err(format!("must be >= 0 seconds, got {seconds}"));
    }
    Ok(Duration::try_from_secs_f64(seconds)
        .ok()
        .and_then(|t| Instant::now().checked_add(t)))
}

/// What became of an offered item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    Queued,
    /// Refused (queue full in drop mode or on the worker thread, or offered
    /// after `close`) and counted in `dropped`.
    Dropped,
    /// The handler is synchronous now (closed by the exit drain): every item
    /// before it was handled, and the caller handles this one itself.
    CallerHandles,
}

/// Starts a worker for a handler: `(handler, maxsize)`.
pub type Spawn<'a, T, H, E> = dyn FnMut(&H, usize) -> Result<Worker<T>, E> + 'a;

/// The set: one per kind of handler, in a `static`.
pub struct AsyncHandlers<T: Send + 'static, H: 'static> {
    live: Mutex<BTreeMap<u64, Weak<Handle<T, H>>>>,
    next_id: AtomicU64,
    orphans: Mutex<Vec<JoinHandle<()>>>,
    at_exit: AtomicBool,
}

impl<T: Send + 'static, H: 'static> Default for AsyncHandlers<T, H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static, H: 'static> AsyncHandlers<T, H> {
    pub const fn new() -> Self {
        AsyncHandlers {
            live: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            at_exit: AtomicBool::new(false),
        }
    }

    /// Makes a handler and enters it in the set until its `Member` is
    /// dropped. After the exit drain it starts closed and synchronous, with
    /// no thread; otherwise `spawn` starts its worker.
    pub fn add<E>(
        &'static self,
        handler: H,
        maxsize: usize,
        on_full: OnFull,
        spawn: &mut Spawn<'_, T, H, E>,
    ) -> Result<Member<T, H>, E> {
        let at_exit = self.at_exit.load(SeqCst);
        let worker = if at_exit {
            Worker::closed(maxsize)
        } else {
            spawn(&handler, maxsize)?
        };
        let handle = Arc::new(Handle {
            handler,
            maxsize,
            on_full,
            worker: WorkerSlot::new(worker),
            synchronous_when_closed: AtomicBool::new(at_exit),
            set: self,
        });
        let id = self.next_id.fetch_add(1, SeqCst);
        self.live.lock().insert(id, Arc::downgrade(&handle));
        Ok(Member { id, handle })
    }

    /// The live handlers, in creation order.
    pub fn live(&self) -> Vec<Arc<Handle<T, H>>> {
        self.live
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Keeps the thread of a dropped handler, whose queue may still drain,
    /// for the exit drain; joins those that ended.
    fn orphan(&self, thread: JoinHandle<()>) {
        let ended = {
            let mut orphans = self.orphans.lock();
            let (ended, draining) = std::mem::take(&mut *orphans)
                .into_iter()
                .partition(JoinHandle::is_finished);
            *orphans = draining;
            orphans.push(thread);
            ended
        };
        // Their sink was dropped and their loop left: joining waits for the
        // OS thread to exit, never for the handler's code (the caller may
        // hold a lock that code needs, such as the GIL).
        for thread in ended {
            let _ = thread.join();
        }
    }

    /// At exit, after the last items were offered: every handler handles
    /// what is queued and closes, synchronous from then on; then the threads
    /// of dropped handlers are waited for. Handlers made later start so.
    pub fn close_all_at_exit<E>(
        &self,
        mut wait: impl FnMut(&mut Step<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.at_exit.store(true, SeqCst);
        for handle in self.live() {
            let worker = handle.worker();
            if !worker.is_closed() {
                // Before `begin_close`: a caller that sees it closed sees this.
                handle.synchronous_when_closed.store(true, SeqCst);
            }
            worker.begin_close();
            wait(&mut || worker.finish_close(SLICE))?;
        }
        let orphans = std::mem::take(&mut *self.orphans.lock());
        for thread in orphans {
            wait(&mut || {
                if !thread.is_finished() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                thread.is_finished()
            })?;
            let _ = thread.join();
        }
        Ok(())
    }

    /// Waits until every live handler handled what was queued before the
    /// call: markers go into every queue first, so that the queues drain
    /// side by side. The handlers stay open. A handler whose worker is the
    /// calling thread is not waited for: it would wait for itself. `false`
    /// when `deadline` came first, or a worker stopped with items left.
    pub fn drain_all<E>(
        &self,
        deadline: Option<Instant>,
        mut wait: impl FnMut(&mut Step<'_>) -> Result<(), E>,
    ) -> Result<bool, E> {
        let handles = self.live();
        let mut flushes: Vec<Flush<T>> = handles
            .iter()
            .map(|handle| handle.worker())
            .filter(|worker| !worker.is_worker_thread())
            .map(Worker::start_flush)
            .collect();
        let mut all_done = true;
        for flush in &mut flushes {
            match wait_flush(flush, deadline, &mut wait)? {
                Some(done) => all_done &= done,
                None => return Ok(false),
            }
        }
        Ok(all_done)
    }

    /// In a forked child: every handler gets a new queue and worker thread
    /// (closed ones, and all of them after the exit drain, a closed worker
    /// with no thread). A handler whose thread cannot be started gets a
    /// closed worker and becomes synchronous; the first such error is
    /// returned, after every handler was given its worker.
    pub fn restart_in_child<E>(&self, spawn: &mut Spawn<'_, T, H, E>) -> Result<(), E> {
        std::mem::forget(std::mem::take(&mut *self.orphans.lock()));
        let mut first_error = None;
        for handle in self.live() {
            let fresh = if handle.worker().is_closed() || self.at_exit.load(SeqCst) {
                Worker::closed(handle.maxsize)
            } else {
                spawn(&handle.handler, handle.maxsize).unwrap_or_else(|err| {
                    // No thread: deliver on the logging thread instead.
                    handle.synchronous_when_closed.store(true, SeqCst);
                    first_error.get_or_insert(err);
                    Worker::closed(handle.maxsize)
                })
            };
            handle.worker.replace_leaking_old(fresh);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Waits for `flush` in steps: `Some(done)` as `Flush::wait` says, `None`
/// when `deadline` came first.
fn wait_flush<T: Send, E>(
    flush: &mut Flush<T>,
    deadline: Option<Instant>,
    wait: &mut impl FnMut(&mut Step<'_>) -> Result<(), E>,
) -> Result<Option<bool>, E> {
    let mut result = None;
    wait(&mut || {
        let now = Instant::now();
        let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
        result = flush.wait(until);
        result.is_some() || deadline.is_some_and(|d| Instant::now() >= d)
    })?;
    Ok(result)
}

/// One handler: its worker (replaced in a forked child) and what it was
/// made with.
pub struct Handle<T: Send + 'static, H: 'static> {
    pub handler: H,
    pub maxsize: usize,
    pub on_full: OnFull,
    worker: WorkerSlot<T>,
    /// Closed by the exit drain (or no thread could be started in a forked
    /// child): items are then handed back to the caller.
    synchronous_when_closed: AtomicBool,
    set: &'static AsyncHandlers<T, H>,
}

impl<T: Send + 'static, H: 'static> Handle<T, H> {
    /// The current worker (the one a forked child's restart put in).
    #[inline]
    pub fn worker(&self) -> &Worker<T> {
        self.worker.get()
    }

    /// Queues `item`; in block mode waits for room (except on the worker
    /// thread, where it would wait for itself: there a full queue drops).
    pub fn offer<E>(
        &self,
        item: T,
        mut wait: impl FnMut(&mut Step<'_>) -> Result<(), E>,
    ) -> Result<Offered, E> {
        let worker = self.worker();
        let mut pushed = worker.try_push(item);
        if self.on_full == OnFull::Block
            && !worker.is_worker_thread()
            && matches!(pushed, Pushed::Full(_))
        {
            wait(
                &mut || match std::mem::replace(&mut pushed, Pushed::Queued) {
                    Pushed::Full(item) => {
                        pushed = worker.push_within(item, SLICE);
                        !matches!(pushed, Pushed::Full(_))
                    }
                    done => {
                        pushed = done;
                        true
                    }
                },
            )?;
        }
        Ok(match pushed {
            Pushed::Queued => Offered::Queued,
            Pushed::Closed(_) if self.synchronous_when_closed.load(SeqCst) => {
                // Behind the queue's last item.
                wait(&mut || worker.wait_idle(SLICE))?;
                Offered::CallerHandles
            }
            Pushed::Full(_) | Pushed::Closed(_) => {
                worker.add_dropped(1);
                Offered::Dropped
            }
        })
    }

    /// Waits until every item queued before the call was handled:
    /// `Some(done)` (`false`: the worker stopped with items left), `None`
    /// when `deadline` came first.
    pub fn flush<E>(
        &self,
        deadline: Option<Instant>,
        mut wait: impl FnMut(&mut Step<'_>) -> Result<(), E>,
    ) -> Result<Option<bool>, E> {
        wait_flush(&mut self.worker().start_flush(), deadline, &mut wait)
    }

    /// Handles what is queued, then stops the worker thread. Idempotent.
    pub fn close<E>(&self, mut wait: impl FnMut(&mut Step<'_>) -> Result<(), E>) -> Result<(), E> {
        let worker = self.worker();
        worker.begin_close();
        wait(&mut || worker.finish_close(SLICE))
    }
}

impl<T: Send + 'static, H: 'static> Drop for Handle<T, H> {
    fn drop(&mut self) {
        // Dropping the worker (after this) drops the queue's sender, which
        // lets the thread drain the queue and end.
        if let Some(thread) = self.worker().take_thread() {
            self.set.orphan(thread);
        }
    }
}

/// A handler's entry in its set: dropping it leaves the set.
pub struct Member<T: Send + 'static, H: 'static> {
    id: u64,
    handle: Arc<Handle<T, H>>,
}

impl<T: Send + 'static, H: 'static> Deref for Member<T, H> {
    type Target = Handle<T, H>;

    fn deref(&self) -> &Handle<T, H> {
        &self.handle
    }
}

impl<T: Send + 'static, H: 'static> Drop for Member<T, H> {
    fn drop(&mut self) {
        self.handle.set.live.lock().remove(&self.id);
    }
}

/// The current worker, read with one load. Replacing one leaks the old:
/// only a forked child replaces, where the old worker's thread does not
/// exist (so it must not be joined) and its locks may be held.
struct WorkerSlot<T: Send + 'static> {
    /// From `Box::into_raw`; freed only by `drop`.
    ptr: AtomicPtr<Worker<T>>,
    _owns: PhantomData<Box<Worker<T>>>,
}

impl<T: Send + 'static> WorkerSlot<T> {
    fn new(worker: Worker<T>) -> Self {
        WorkerSlot {
            ptr: AtomicPtr::new(Box::into_raw(Box::new(worker))),
            _owns: PhantomData,
        }
    }

    #[inline]
    fn get(&self) -> &Worker<T> {
        // SAFETY: `ptr` always holds a pointer from `Box::into_raw`, never
        // null. A pointer replaced by `replace_leaking_old` is never freed,
        // so a reference read before the replacement stays valid for ever;
        // the current one is freed only by `drop`, which takes `&mut self`,
        // so no reference returned here (borrowing `self`) outlives it.
        // `Worker<T>` is `Sync` (`T: Send`), so sharing it is sound.
        unsafe { &*self.ptr.load(SeqCst) }
    }

    fn replace_leaking_old(&self, worker: Worker<T>) {
        // The old pointer is dropped on the floor: its worker is leaked.
        self.ptr.swap(Box::into_raw(Box::new(worker)), SeqCst);
    }
}

impl<T: Send + 'static> Drop for WorkerSlot<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::into_raw` and is freed only
        // here, once; `&mut self` proves no reference from `get` is alive.
        drop(unsafe { Box::from_raw(*self.ptr.get_mut()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::{Flow, Sink};
    use std::sync::mpsc;

    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn runtime_errors_are_worded_for_the_method() {
        assert_eq!(
            worker_start_message("out of threads"),
            "AsyncEventHandler: cannot start its worker thread: out of threads"
        );
        assert_eq!(
            own_thread_message("flush"),
            "AsyncEventHandler.flush() called from its own handler would wait for itself"
        );
    }

    #[test]
    fn argument_rules_word_their_problems() {
        let repr = |text: &str| {
            let text = text.to_owned();
            move || text
        };
        assert_eq!(check_maxsize(Some(1), repr("1")), Ok(1));
        assert_eq!(
            check_maxsize(Some(MAX_QUEUE as i64), repr("")),
            Ok(MAX_QUEUE)
        );
        for (value, text) in [(Some(0), "0"), (Some(-1), "-1"), (None, "2**70")] {
            assert_eq!(
                check_maxsize(value, repr(text)),
                Err(format!("must be between 1 and {MAX_QUEUE}, got {text}"))
            );
        }
        assert!(check_maxsize(Some(MAX_QUEUE as i64 + 1), repr("")).is_err());
        assert_eq!(check_on_full("block"), Ok(OnFull::Block));
        assert_eq!(
            check_on_full("wait"),
            Err("must be \"drop\" or \"block\", got \"wait\"".to_owned())
        );
        assert_eq!(
            deadline_in(-1.0),
            Err("must be >= 0 seconds, got -1".to_owned())
        );
        assert!(deadline_in(f64::NAN).is_err());
        assert_eq!(deadline_in(f64::INFINITY), Ok(None));
        assert_eq!(deadline_in(1e300), Ok(None));
        let soon = deadline_in(1.0).unwrap().expect("a deadline");
        assert!(soon > Instant::now());
    }

    /// Sends every item to `out`, holding while `gate` is locked.
    struct Collect {
        out: mpsc::Sender<u32>,
        gate: Arc<parking_lot::Mutex<()>>,
    }

    impl Sink<u32> for Collect {
        fn handle(&mut self, items: &mut dyn Iterator<Item = u32>) -> Flow {
            for item in items {
                let _open = self.gate.lock();
                let _ = self.out.send(item);
            }
            Flow::Continue
        }
    }

    /// The handler: where its items go, and the gate its worker holds on.
    struct Target {
        out: mpsc::Sender<u32>,
        gate: Arc<parking_lot::Mutex<()>>,
    }

    type Set = AsyncHandlers<u32, Target>;

    fn new_set() -> &'static Set {
        Box::leak(Box::new(Set::new()))
    }

    fn spawn(target: &Target, maxsize: usize) -> std::io::Result<Worker<u32>> {
        let sink = Collect {
            out: target.out.clone(),
            gate: Arc::clone(&target.gate),
        };
        Worker::spawn(maxsize, sink, "test-async")
    }

    fn add(
        set: &'static Set,
        maxsize: usize,
        on_full: OnFull,
    ) -> (
        Member<u32, Target>,
        mpsc::Receiver<u32>,
        Arc<parking_lot::Mutex<()>>,
    ) {
        let (out, got) = mpsc::channel();
        let gate = Arc::new(parking_lot::Mutex::new(()));
        let target = Target {
            out,
            gate: Arc::clone(&gate),
        };
        let member = set.add(target, maxsize, on_full, &mut spawn).unwrap();
        (member, got, gate)
    }

    /// A wait that never fails.
    fn no_wait(step: &mut Step<'_>) -> Result<(), ()> {
        while !step() {}
        Ok(())
    }

    #[test]
    fn members_are_live_until_dropped_in_creation_order() {
        let set = new_set();
        let (a, _, _) = add(set, 4, OnFull::Drop);
        let (b, _, _) = add(set, 8, OnFull::Block);
        let sizes: Vec<usize> = set.live().iter().map(|h| h.maxsize).collect();
        assert_eq!(sizes, vec![4, 8]);
        drop(a);
        assert_eq!(set.live().len(), 1);
        assert_eq!(set.live()[0].on_full, OnFull::Block);
        drop(b);
        assert!(set.live().is_empty());
    }

    #[test]
    fn drop_mode_counts_what_a_full_queue_refuses() {
        let set = new_set();
        let (h, got, gate) = add(set, 1, OnFull::Drop);
        let held = gate.lock();
        assert_eq!(h.offer(1, no_wait), Ok(Offered::Queued));
        assert_eq!(h.offer(2, no_wait), Ok(Offered::Dropped));
        assert_eq!(h.worker().dropped(), 1);
        drop(held);
        assert_eq!(h.flush(None, no_wait), Ok(Some(true)));
        assert_eq!(got.try_iter().collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn block_mode_waits_in_steps_and_a_failed_wait_ends_it() {
        let set = new_set();
        let (h, got, gate) = add(set, 1, OnFull::Block);
        let held = gate.lock();
        assert_eq!(h.offer(1, no_wait), Ok(Offered::Queued));
        // The "signal" arrives at the first step that found no room.
        let mut calls = 0;
        let interrupted = h.offer(2, |step: &mut Step<'_>| {
            calls += 1;
            if step() { Ok(()) } else { Err("interrupted") }
        });
        assert_eq!(interrupted, Err("interrupted"));
        assert_eq!(calls, 1);
        assert_eq!(h.worker().dropped(), 0);
        let h = Arc::new(h);
        let producer = {
            let h = Arc::clone(&h);
            std::thread::spawn(move || h.offer(3, no_wait))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(producer.join().unwrap(), Ok(Offered::Queued));
        assert_eq!(h.flush(None, no_wait), Ok(Some(true)));
        assert_eq!(got.try_iter().collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn a_flush_past_its_deadline_says_none() {
        let set = new_set();
        let (h, _got, gate) = add(set, 4, OnFull::Drop);
        let held = gate.lock();
        assert_eq!(h.offer(1, no_wait), Ok(Offered::Queued));
        let soon = Instant::now() + Duration::from_millis(30);
        assert_eq!(h.flush(Some(soon), no_wait), Ok(None));
        assert_eq!(set.drain_all(Some(soon), no_wait), Ok(false));
        drop(held);
        assert_eq!(set.drain_all(None, no_wait), Ok(true));
        assert_eq!(
            h.flush(Some(Instant::now() + LONG), no_wait),
            Ok(Some(true))
        );
    }

    #[test]
    fn drain_all_waits_for_every_queue_and_leaves_them_open() {
        let set = new_set();
        let handlers: Vec<_> = (0..3).map(|_| add(set, 64, OnFull::Drop)).collect();
        for (i, (h, _, _)) in handlers.iter().enumerate() {
            for v in 0..50 {
                assert_eq!(h.offer(i as u32 * 100 + v, no_wait), Ok(Offered::Queued));
            }
        }
        assert_eq!(set.drain_all(None, no_wait), Ok(true));
        for (i, (h, got, _)) in handlers.iter().enumerate() {
            let expected: Vec<u32> = (0..50).map(|v| i as u32 * 100 + v).collect();
            assert_eq!(got.try_iter().collect::<Vec<_>>(), expected);
            assert!(!h.worker().is_closed());
        }
    }

    #[test]
    fn after_the_exit_drain_items_go_back_to_the_caller_in_order() {
        let set = new_set();
        let (h, got, _gate) = add(set, 64, OnFull::Drop);
        let (closed_before, _, _) = add(set, 4, OnFull::Drop);
        closed_before.close(no_wait).unwrap();
        for v in 0..10 {
            assert_eq!(h.offer(v, no_wait), Ok(Offered::Queued));
        }
        set.close_all_at_exit(no_wait).unwrap();
        // Everything queued was handled before the drain returned.
        assert_eq!(got.try_iter().count(), 10);
        assert!(h.worker().is_closed() && h.worker().is_stopped());
        assert_eq!(h.offer(10, no_wait), Ok(Offered::CallerHandles));
        // Closed by its user before the drain: still drops.
        assert_eq!(closed_before.offer(1, no_wait), Ok(Offered::Dropped));
        // Made after the drain: closed, no thread, synchronous.
        let (late, late_got, _) = add(set, 4, OnFull::Block);
        assert!(late.worker().is_closed() && late.worker().take_thread().is_none());
        assert_eq!(late.offer(1, no_wait), Ok(Offered::CallerHandles));
        assert_eq!(late_got.try_iter().count(), 0);
    }

    #[test]
    fn a_dropped_handler_still_delivers_and_the_exit_drain_joins_its_thread() {
        let set = new_set();
        let (h, got, gate) = add(set, 64, OnFull::Drop);
        let held = gate.lock();
        for v in 0..20 {
            assert_eq!(h.offer(v, no_wait), Ok(Offered::Queued));
        }
        drop(h);
        assert!(set.live().is_empty());
        assert_eq!(set.orphans.lock().len(), 1);
        drop(held);
        set.close_all_at_exit(no_wait).unwrap();
        assert!(set.orphans.lock().is_empty());
        assert_eq!(
            got.try_iter().collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
    }

    #[test]
    fn ended_orphans_are_joined_when_another_is_added() {
        let set = new_set();
        for _ in 0..50 {
            let (h, _, _) = add(set, 4, OnFull::Drop);
            drop(h);
            assert!(!set.orphans.lock().is_empty());
            // Wait for it to end, so that the next add joins it.
            let deadline = Instant::now() + LONG;
            while !set.orphans.lock().iter().all(JoinHandle::is_finished)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Only the last one can be left.
        assert_eq!(set.orphans.lock().len(), 1);
    }

    #[test]
    fn restart_gives_open_handlers_a_new_worker_and_keeps_closed_ones_closed() {
        let set = new_set();
        let (open, got, _gate) = add(set, 8, OnFull::Drop);
        let (closed, _, _) = add(set, 8, OnFull::Drop);
        closed.close(no_wait).unwrap();
        let old = open.worker() as *const Worker<u32>;
        assert_eq!(open.offer(1, no_wait), Ok(Offered::Queued));
        assert_eq!(open.flush(None, no_wait), Ok(Some(true)));
        let mut spawned = 0;
        set.restart_in_child(&mut |target, maxsize| {
            spawned += 1;
            spawn(target, maxsize)
        })
        .unwrap();
        assert_eq!(spawned, 1);
        assert!(!std::ptr::eq(open.worker(), old));
        assert_eq!(open.worker().handled(), 0);
        assert_eq!(open.offer(2, no_wait), Ok(Offered::Queued));
        assert_eq!(open.flush(None, no_wait), Ok(Some(true)));
        assert_eq!(got.try_iter().collect::<Vec<_>>(), vec![1, 2]);
        assert!(closed.worker().is_closed());
        assert_eq!(closed.offer(3, no_wait), Ok(Offered::Dropped));
    }

    #[test]
    fn restart_without_a_thread_makes_the_handler_synchronous() {
        let set = new_set();
        let (a, _, _) = add(set, 8, OnFull::Drop);
        let (b, _, _) = add(set, 8, OnFull::Drop);
        let mut calls = 0;
        let result = set.restart_in_child(&mut |_, _| {
            calls += 1;
            Err(std::io::Error::other(format!("no thread {calls}")))
        });
        // Every handler was tried; the first error is the one returned.
        assert_eq!(calls, 2);
        assert_eq!(result.unwrap_err().to_string(), "no thread 1");
        for h in [&a, &b] {
            assert!(h.worker().is_closed());
            assert_eq!(h.offer(1, no_wait), Ok(Offered::CallerHandles));
        }
    }

    #[test]
    fn restart_after_the_exit_drain_starts_no_thread() {
        let set = new_set();
        let (h, _, _) = add(set, 8, OnFull::Drop);
        set.close_all_at_exit(no_wait).unwrap();
        set.restart_in_child::<()>(&mut |_, _| panic!("no thread after exit"))
            .unwrap();
        assert_eq!(h.offer(1, no_wait), Ok(Offered::CallerHandles));
    }

    #[test]
    fn on_full_names_round_trip() {
        for mode in [OnFull::Drop, OnFull::Block] {
            assert_eq!(OnFull::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(OnFull::parse("Drop"), None);
    }
}
