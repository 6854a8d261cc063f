//! A bounded queue drained in order by one background thread, free of PyO3
//! (generic over the item and the code that handles it). The thread may be
//! started later than the queue is made (`new`, then `start`), and a caller
//! may take back what the thread has not taken yet (`take_queued`).
//!
//! The bound is `pending`: items accepted and not yet handled, the one the
//! worker is handling included, so that at most `capacity` items are ever
//! held (a channel alone would hold `capacity` plus the one in hand). The
//! crossbeam channel is only the transport: `pending` keeps items from ever
//! filling it, and its spare room takes the flush markers.
//!
//! Closing is a Dekker handshake on `pending` and `closed`: a producer
//! counts itself in `pending` before it reads `closed`, and `close` sets
//! `closed` before it waits for `pending` to reach zero. So every producer
//! either sees `closed` and takes nothing, or is waited for, and the `Stop`
//! message is sent after every accepted item.

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TrySendError};
use parking_lot::{Condvar, Mutex};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

/// What the worker does after a `Sink::handle` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The sink cannot run any more (the interpreter is finalizing): the
    /// worker stops, counting what is left as dropped.
    Stop,
}

/// The code the worker runs for the items.
pub trait Sink<T>: Send + 'static {
    /// Handles `items` in order. An item counts as handled once the next one
    /// is asked for, or `items` is left; a sink that stops before taking the
    /// first one has it counted as dropped.
    fn handle(&mut self, items: &mut dyn Iterator<Item = T>) -> Flow;
}

/// A sink chosen at run time (a `Worker` started from a static).
impl<T: 'static> Sink<T> for Box<dyn Sink<T>> {
    fn handle(&mut self, items: &mut dyn Iterator<Item = T>) -> Flow {
        (**self).handle(items)
    }
}

/// The result of offering an item.
#[derive(Debug)]
pub enum Pushed<T> {
    Queued,
    /// `capacity` items are pending (or, for `push_within`, still were when
    /// the patience ran out). Not counted as dropped: the caller decides.
    Full(T),
    /// The worker was closed (or has stopped).
    Closed(T),
}

enum Msg<T> {
    Item(T),
    Flush(FlushToken),
    Stop,
}

/// Completion of one flush, set by the worker or, should the marker be
/// discarded unhandled, by the token's drop.
struct Signal {
    done: Mutex<Option<bool>>,
    changed: Condvar,
}

impl Signal {
    fn set(&self, value: bool) {
        let mut done = self.done.lock();
        if done.is_none() {
            *done = Some(value);
            self.changed.notify_all();
        }
    }
}

struct FlushToken(Arc<Signal>);

impl Drop for FlushToken {
    fn drop(&mut self) {
        // Marks a marker the worker never reached; a no-op once completed.
        self.0.set(false);
    }
}

struct State {
    capacity: usize,
    pending: AtomicUsize,
    closed: AtomicBool,
    /// The worker thread has ended (or, for `Worker::closed`, never existed).
    stopped: AtomicBool,
    /// Set by the worker thread itself, first thing: whoever asks from that
    /// thread finds it set.
    thread_id: OnceLock<ThreadId>,
    dropped: AtomicU64,
    handled: AtomicU64,
    /// Threads waiting on `changed`, so that `release` takes the lock only
    /// when someone waits.
    waiters: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
}

impl State {
    fn release(&self, n: usize) {
        self.pending.fetch_sub(n, SeqCst);
        self.notify();
    }

    fn notify(&self) {
        // SeqCst pairs with `wait_until`: a waiter counted itself before it
        // checked its condition, so either it sees this change or we see it.
        if self.waiters.load(SeqCst) > 0 {
            let _guard = self.lock.lock();
            self.changed.notify_all();
        }
    }

    /// Waits until `ready()` or `deadline`; returns `ready()`.
    fn wait_until(&self, ready: impl Fn() -> bool, deadline: Instant) -> bool {
        let mut guard = self.lock.lock();
        self.waiters.fetch_add(1, SeqCst);
        let result = loop {
            if ready() {
                break true;
            }
            if self.changed.wait_until(&mut guard, deadline).timed_out() {
                break ready();
            }
        };
        self.waiters.fetch_sub(1, SeqCst);
        result
    }
}

/// The items the sink takes in one `handle` call: the first one received,
/// then whatever the channel holds, until it is empty or a flush marker
/// comes. Each counts as handled when the next is taken. A flush marker
/// ends the batch and is answered once `handle` has returned, so that a sink
/// that buffers within a call (the TensorBoard writer's one write per
/// batch) has written everything before the marker; `Stop` ends the run and
/// is left for the worker loop.
struct Batch<'a, T> {
    first: Option<T>,
    rx: &'a Receiver<Msg<T>>,
    stop: &'a mut bool,
    state: &'a State,
    in_hand: bool,
    /// The marker that ended the batch, answered on drop.
    marker: Option<FlushToken>,
}

impl<T> Batch<'_, T> {
    fn finish_in_hand(&mut self) {
        if std::mem::take(&mut self.in_hand) {
            self.state.handled.fetch_add(1, SeqCst);
            self.state.release(1);
        }
    }
}

impl<T> Iterator for Batch<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.finish_in_hand();
        let item = match self.first.take() {
            Some(item) => Some(item),
            None => loop {
                if *self.stop || self.marker.is_some() {
                    break None;
                }
                match self.rx.try_recv() {
                    Ok(Msg::Item(item)) => break Some(item),
                    Ok(Msg::Flush(token)) => self.marker = Some(token),
                    Ok(Msg::Stop) => *self.stop = true,
                    Err(_) => break None,
                }
            },
        };
        self.in_hand = item.is_some();
        item
    }
}

impl<T> Drop for Batch<'_, T> {
    fn drop(&mut self) {
        self.finish_in_hand();
        if let Some(item) = self.first.take() {
            drop(item);
            self.state.dropped.fetch_add(1, SeqCst);
            self.state.release(1);
        }
        // After the sink returned: everything before the marker was handled.
        if let Some(token) = self.marker.take() {
            token.0.set(true);
        }
    }
}

/// A flush in progress: `wait` until the marker comes back.
pub struct Flush<T> {
    tx: Option<Sender<Msg<T>>>,
    marker: Option<Msg<T>>,
    signal: Arc<Signal>,
    state: Arc<State>,
}

impl<T> Flush<T> {
    /// `Some(true)` once every item accepted before `start_flush` was
    /// handled, `Some(false)` if the worker stopped before, `None` when
    /// `deadline` came first (call again to keep waiting).
    pub fn wait(&mut self, deadline: Instant) -> Option<bool> {
        if let Some(marker) = self.marker.take() {
            // A stopped worker answers no marker, and would leave it queued
            // (the worker keeps a receiver for `take_queued`).
            let tx = match &self.tx {
                Some(tx) if !self.state.stopped.load(SeqCst) => tx,
                _ => return Some(self.state.pending.load(SeqCst) == 0),
            };
            match tx.send_deadline(marker, deadline) {
                Ok(()) => {}
                Err(SendTimeoutError::Timeout(marker)) => {
                    self.marker = Some(marker);
                    return None;
                }
                Err(SendTimeoutError::Disconnected(marker)) => {
                    drop(marker);
                    return Some(self.state.pending.load(SeqCst) == 0);
                }
            }
        }
        let mut done = self.signal.done.lock();
        loop {
            if let Some(result) = *done {
                return Some(result);
            }
            // A marker sent just as the worker ended is never answered.
            if self.state.stopped.load(SeqCst) {
                return Some(self.state.pending.load(SeqCst) == 0);
            }
            let slice = (Instant::now() + Duration::from_millis(20)).min(deadline);
            if self.signal.changed.wait_until(&mut done, slice).timed_out()
                && Instant::now() >= deadline
            {
                return *done;
            }
        }
    }
}

/// The queue and its worker thread.
pub struct Worker<T: Send + 'static> {
    tx: Option<Sender<Msg<T>>>,
    /// The queue's receiving end, cloned for the thread by `start`; kept for
    /// `take_queued`.
    rx: Option<Receiver<Msg<T>>>,
    state: Arc<State>,
    thread: Mutex<Option<JoinHandle<()>>>,
    started: AtomicBool,
}

impl<T: Send + 'static> Worker<T> {
    /// Starts a worker thread named `name` that passes items to `sink`.
    pub fn spawn(capacity: usize, sink: impl Sink<T>, name: &str) -> std::io::Result<Self> {
        let worker = Self::new(capacity);
        worker.start(sink, name)?;
        Ok(worker)
    }

    /// An open queue with no thread yet: items wait for `start` (or for
    /// `take_queued`). Flushes are answered only once a thread runs.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        // Items never fill the channel (`pending` is the bound); the room
        // beyond `capacity` is for flush markers and `Stop`.
        let (tx, rx) = crossbeam_channel::bounded(capacity.saturating_add(16));
        Worker {
            tx: Some(tx),
            rx: Some(rx),
            state: Arc::new(Self::new_state(capacity)),
            thread: Mutex::new(None),
            started: AtomicBool::new(false),
        }
    }

    /// Starts the thread named `name` that passes items to `sink`, unless
    /// one was started already or the worker is closed (then `sink` is
    /// dropped). On error, no thread runs and `start` may be called again.
    pub fn start(&self, sink: impl Sink<T>, name: &str) -> std::io::Result<()> {
        let mut thread = self.thread.lock();
        let Some(rx) = &self.rx else {
            return Ok(());
        };
        if self.started.load(SeqCst) || self.state.closed.load(SeqCst) {
            return Ok(());
        }
        let (rx, state) = (rx.clone(), Arc::clone(&self.state));
        let builder = std::thread::Builder::new().name(name.to_owned());
        let handle = crate::threads::spawn(builder, move || {
            let _ = state.thread_id.set(std::thread::current().id());
            run(rx, &state, sink);
        })?;
        *thread = Some(handle);
        self.started.store(true, SeqCst);
        Ok(())
    }

    /// Whether a thread was started (it may have ended since).
    pub fn has_thread(&self) -> bool {
        self.started.load(SeqCst)
    }

    /// A worker that is closed from the start and has no thread.
    pub fn closed(capacity: usize) -> Self {
        let state = Self::new_state(capacity.max(1));
        state.closed.store(true, SeqCst);
        state.stopped.store(true, SeqCst);
        Worker {
            tx: None,
            rx: None,
            state: Arc::new(state),
            thread: Mutex::new(None),
            started: AtomicBool::new(false),
        }
    }

    fn new_state(capacity: usize) -> State {
        State {
            capacity,
            pending: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            thread_id: OnceLock::new(),
            dropped: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            changed: Condvar::new(),
        }
    }

    /// Sends an item already counted in `pending`, after checking `closed`
    /// (the second half of the handshake with `begin_close`).
    fn send_admitted(&self, item: T) -> Pushed<T> {
        let tx = match &self.tx {
            Some(tx) if !self.state.closed.load(SeqCst) => tx,
            _ => {
                self.state.release(1);
                return Pushed::Closed(item);
            }
        };
        let sent = match tx.try_send(Msg::Item(item)) {
            Ok(()) => Ok(()),
            // The channel has room for every admitted item: only flush
            // markers fill it, and the worker answers them without delay.
            Err(TrySendError::Full(msg)) => tx.send(msg).map_err(|err| err.into_inner()),
            Err(TrySendError::Disconnected(msg)) => Err(msg),
        };
        match sent {
            Ok(()) => {
                // The thread stopped (its sink could not run) while this item
                // was sent: nobody else would take it out.
                if self.state.stopped.load(SeqCst) {
                    self.discard_queued();
                }
                Pushed::Queued
            }
            Err(msg) => {
                self.state.release(1);
                match msg {
                    Msg::Item(item) => Pushed::Closed(item),
                    _ => unreachable!("sent an item"),
                }
            }
        }
    }

    /// Queues `item` unless `capacity` items are pending. Never waits
    /// (except, briefly, behind concurrent flush markers).
    #[inline]
    pub fn try_push(&self, item: T) -> Pushed<T> {
        let before = self.state.pending.fetch_add(1, SeqCst);
        if before >= self.state.capacity && !self.state.closed.load(SeqCst) {
            self.state.release(1);
            return Pushed::Full(item);
        }
        self.send_admitted(item)
    }

    /// Queues `item`, waiting up to `patience` for room; `Full(item)` when
    /// there still was none (call again to keep waiting).
    pub fn push_within(&self, item: T, patience: Duration) -> Pushed<T> {
        let deadline = Instant::now() + patience;
        let state = &*self.state;
        loop {
            if state.closed.load(SeqCst) {
                return Pushed::Closed(item);
            }
            let pending = state.pending.load(SeqCst);
            if pending < state.capacity {
                if state
                    .pending
                    .compare_exchange(pending, pending + 1, SeqCst, SeqCst)
                    .is_ok()
                {
                    return self.send_admitted(item);
                }
                continue;
            }
            let has_room =
                || state.pending.load(SeqCst) < state.capacity || state.closed.load(SeqCst);
            if !state.wait_until(has_room, deadline) {
                return Pushed::Full(item);
            }
        }
    }

    /// Starts a flush: a marker queued behind every item accepted so far.
    pub fn start_flush(&self) -> Flush<T> {
        let signal = Arc::new(Signal {
            done: Mutex::new(None),
            changed: Condvar::new(),
        });
        Flush {
            tx: self.tx.clone(),
            marker: Some(Msg::Flush(FlushToken(Arc::clone(&signal)))),
            signal,
            state: Arc::clone(&self.state),
        }
    }

    /// Refuses new items from now on (they come back as `Pushed::Closed`).
    pub fn begin_close(&self) {
        self.state.closed.store(true, SeqCst);
        self.state.notify();
    }

    /// After `begin_close`: waits up to `patience` for the pending items to
    /// be handled, then stops the thread and joins it. `false`: items were
    /// still pending (call again to keep waiting).
    pub fn finish_close(&self, patience: Duration) -> bool {
        let state = &*self.state;
        let deadline = Instant::now() + patience;
        // `stopped`: a worker that stopped early leaves nothing to wait for.
        let idle = || state.pending.load(SeqCst) == 0 || state.stopped.load(SeqCst);
        if !state.wait_until(idle, deadline) {
            return false;
        }
        // Held while joining, so that a concurrent close returns only after
        // the thread ended too.
        let mut thread = self.thread.lock();
        if let Some(handle) = thread.take() {
            if let Some(tx) = &self.tx
                && !state.stopped.load(SeqCst)
            {
                // Nothing can be accepted any more: the channel holds at most
                // flush markers, answered ahead of `Stop`.
                let _ = tx.send(Msg::Stop);
            }
            let _ = handle.join();
        }
        true
    }

    /// Waits up to `patience` for nothing to be pending.
    pub fn wait_idle(&self, patience: Duration) -> bool {
        let state = &*self.state;
        state.wait_until(
            || state.pending.load(SeqCst) == 0 || state.stopped.load(SeqCst),
            Instant::now() + patience,
        )
    }

    /// Takes back the items the thread has not taken yet, in order: they are
    /// the caller's now, neither handled nor dropped. A flush marker met on
    /// the way is answered (what was before it is the caller's).
    pub fn take_queued(&self) -> Vec<T> {
        let mut items = Vec::new();
        let Some(rx) = &self.rx else {
            return items;
        };
        let mut stop = false;
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Msg::Item(item) => items.push(item),
                Msg::Flush(token) => token.0.set(true),
                Msg::Stop => stop = true,
            }
        }
        if stop && let Some(tx) = &self.tx {
            // Given back for the thread, which `finish_close` is joining.
            let _ = tx.try_send(Msg::Stop);
        }
        self.state.release(items.len());
        items
    }

    fn discard_queued(&self) {
        if let Some(rx) = &self.rx {
            while let Ok(msg) = rx.try_recv() {
                discard(&self.state, msg);
            }
        }
    }

    /// The thread, for whoever drops this worker and wants to join it later.
    pub fn take_thread(&self) -> Option<JoinHandle<()>> {
        self.thread.lock().take()
    }

    pub fn add_dropped(&self, n: u64) {
        self.state.dropped.fetch_add(n, SeqCst);
    }

    /// The dropped count so far, which starts again from 0.
    pub fn take_dropped(&self) -> u64 {
        self.state.dropped.swap(0, SeqCst)
    }

    /// Whether the calling thread is the worker thread.
    pub fn is_worker_thread(&self) -> bool {
        self.state.thread_id.get() == Some(&std::thread::current().id())
    }

    /// Items accepted and not yet handled (a producer in the middle of
    /// offering one counts for a moment).
    pub fn pending(&self) -> usize {
        self.state.pending.load(SeqCst)
    }

    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(SeqCst)
    }

    pub fn handled(&self) -> u64 {
        self.state.handled.load(SeqCst)
    }

    pub fn is_closed(&self) -> bool {
        self.state.closed.load(SeqCst)
    }

    pub fn is_stopped(&self) -> bool {
        self.state.stopped.load(SeqCst)
    }
}

fn run<T: Send + 'static>(rx: Receiver<Msg<T>>, state: &State, mut sink: impl Sink<T>) {
    let mut stop = false;
    while !stop {
        let first = match rx.recv() {
            Ok(Msg::Item(item)) => item,
            Ok(Msg::Flush(token)) => {
                token.0.set(true);
                continue;
            }
            // `Err`: every sender is gone (the owner was dropped).
            Ok(Msg::Stop) | Err(_) => break,
        };
        // One `handle` call (one attach to Python) drains everything the
        // channel holds: a producer that holds the GIL cannot add more
        // meanwhile, so a per-call limit would only add a GIL hand-off, which
        // costs the producer a switch interval, per limit's worth of items.
        let mut items = Batch {
            first: Some(first),
            rx: &rx,
            stop: &mut stop,
            state,
            in_hand: false,
            marker: None,
        };
        // A panicking sink must not leave items pending for ever.
        let flow = catch_unwind(AssertUnwindSafe(|| sink.handle(&mut items))).unwrap_or(Flow::Stop);
        drop(items);
        if flow == Flow::Stop {
            state.closed.store(true, SeqCst);
            break;
        }
    }
    // Whatever is left was accepted but will not be handled. Again once
    // `stopped` is set: a producer that sent meanwhile, before seeing it,
    // is taken out here (one that sees it takes its item out itself).
    while let Ok(msg) = rx.try_recv() {
        discard(state, msg);
    }
    state.stopped.store(true, SeqCst);
    while let Ok(msg) = rx.try_recv() {
        discard(state, msg);
    }
    state.notify();
    drop(sink);
}

fn discard<T>(state: &State, msg: Msg<T>) {
    match msg {
        Msg::Item(item) => {
            drop(item);
            state.dropped.fetch_add(1, SeqCst);
            state.release(1);
        }
        // Everything ahead of the marker was dealt with.
        Msg::Flush(token) => token.0.set(state.pending.load(SeqCst) == 0),
        Msg::Stop => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const LONG: Duration = Duration::from_secs(10);

    /// Sends every item to a channel; announces each on `started` first,
    /// then holds while `gate` is locked.
    struct Collect {
        out: mpsc::Sender<u32>,
        started: mpsc::Sender<u32>,
        gate: Arc<Mutex<()>>,
    }

    impl Sink<u32> for Collect {
        fn handle(&mut self, items: &mut dyn Iterator<Item = u32>) -> Flow {
            for item in items {
                let _ = self.started.send(item);
                let _open = self.gate.lock();
                self.out.send(item).unwrap();
            }
            Flow::Continue
        }
    }

    struct Harness {
        got: mpsc::Receiver<u32>,
        started: mpsc::Receiver<u32>,
        gate: Arc<Mutex<()>>,
    }

    fn collector() -> (Collect, Harness) {
        let (out, got) = mpsc::channel();
        let (started_tx, started) = mpsc::channel();
        let gate = Arc::new(Mutex::new(()));
        let sink = Collect {
            out,
            started: started_tx,
            gate: Arc::clone(&gate),
        };
        (sink, Harness { got, started, gate })
    }

    fn collecting(capacity: usize) -> (Worker<u32>, Harness) {
        let (sink, harness) = collector();
        (
            Worker::spawn(capacity, sink, "test-worker").unwrap(),
            harness,
        )
    }

    fn flush(worker: &Worker<u32>) -> Option<bool> {
        worker.start_flush().wait(Instant::now() + LONG)
    }

    #[test]
    fn items_arrive_in_order() {
        let (worker, h) = collecting(16);
        let mut sent = 0;
        for i in 0..5000 {
            loop {
                match worker.try_push(i) {
                    Pushed::Queued => break,
                    Pushed::Full(_) => std::thread::yield_now(),
                    Pushed::Closed(_) => panic!("closed"),
                }
            }
            sent += 1;
        }
        assert_eq!(flush(&worker), Some(true));
        let received: Vec<u32> = h.got.try_iter().collect();
        assert_eq!(received, (0..sent).collect::<Vec<_>>());
        assert_eq!(worker.handled(), 5000);
        assert_eq!(worker.pending(), 0);
    }

    #[test]
    fn capacity_counts_the_item_in_hand() {
        let (worker, h) = collecting(3);
        let closed_gate = h.gate.lock();
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        // The worker holds item 0, blocked on the gate.
        assert_eq!(h.started.recv_timeout(LONG), Ok(0));
        assert!(matches!(worker.try_push(1), Pushed::Queued));
        assert!(matches!(worker.try_push(2), Pushed::Queued));
        assert!(matches!(worker.try_push(3), Pushed::Full(3)));
        assert_eq!(worker.pending(), 3);
        drop(closed_gate);
        assert_eq!(flush(&worker), Some(true));
        assert_eq!(h.got.try_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn push_within_waits_for_room() {
        let (worker, h) = collecting(1);
        let closed_gate = h.gate.lock();
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        assert!(matches!(
            worker.push_within(1, Duration::from_millis(20)),
            Pushed::Full(1)
        ));
        let worker = Arc::new(worker);
        let producer = {
            let worker = Arc::clone(&worker);
            std::thread::spawn(move || matches!(worker.push_within(1, LONG), Pushed::Queued))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(closed_gate);
        assert!(producer.join().unwrap());
        assert_eq!(flush(&worker), Some(true));
        assert_eq!(h.got.try_iter().collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn flush_times_out_while_the_sink_is_held() {
        let (worker, h) = collecting(4);
        let closed_gate = h.gate.lock();
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        let mut flush = worker.start_flush();
        assert_eq!(flush.wait(Instant::now() + Duration::from_millis(30)), None);
        drop(closed_gate);
        assert_eq!(flush.wait(Instant::now() + LONG), Some(true));
    }

    #[test]
    fn close_handles_everything_then_refuses() {
        let (worker, h) = collecting(8);
        for i in 0..8 {
            assert!(matches!(worker.try_push(i), Pushed::Queued));
        }
        worker.begin_close();
        assert!(worker.finish_close(LONG));
        assert!(worker.is_stopped());
        assert_eq!(h.got.try_iter().count(), 8);
        assert!(matches!(worker.try_push(9), Pushed::Closed(9)));
        assert!(matches!(worker.push_within(9, LONG), Pushed::Closed(9)));
        // Idempotent.
        worker.begin_close();
        assert!(worker.finish_close(LONG));
        assert_eq!(flush(&worker), Some(true));
    }

    #[test]
    fn concurrent_producers_lose_nothing_that_was_accepted() {
        let (worker, h) = collecting(8);
        let worker = Arc::new(worker);
        let producers: Vec<_> = (0..4)
            .map(|t| {
                let worker = Arc::clone(&worker);
                std::thread::spawn(move || {
                    let mut queued = 0;
                    for i in 0..2000 {
                        if matches!(worker.try_push(t * 10_000 + i), Pushed::Queued) {
                            queued += 1;
                        }
                    }
                    queued
                })
            })
            .collect();
        let queued: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
        worker.begin_close();
        assert!(worker.finish_close(LONG));
        let received: Vec<u32> = h.got.try_iter().collect();
        assert_eq!(received.len() as u64, queued);
        // Each producer's items keep their order.
        for t in 0..4 {
            let mine: Vec<u32> = received
                .iter()
                .copied()
                .filter(|v| v / 10_000 == t)
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]));
        }
    }

    struct Stopper;

    impl Sink<u32> for Stopper {
        fn handle(&mut self, items: &mut dyn Iterator<Item = u32>) -> Flow {
            let _ = items.next();
            Flow::Stop
        }
    }

    #[test]
    fn a_stopping_sink_counts_the_rest_as_dropped() {
        let worker = Worker::spawn(8, Stopper, "test-stopper").unwrap();
        for i in 0..5 {
            let _ = worker.try_push(i);
        }
        let deadline = Instant::now() + LONG;
        while !worker.is_stopped() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(worker.is_stopped());
        assert_eq!(worker.pending(), 0);
        assert_eq!(worker.handled() + worker.dropped(), 5);
        assert!(worker.handled() >= 1);
        assert!(matches!(worker.try_push(9), Pushed::Closed(9)));
        // Flushes find it stopped and leave no marker behind, which, more
        // than the queue's room, would block the next flush and the close.
        for _ in 0..40 {
            assert_eq!(flush(&worker), Some(true));
        }
        worker.begin_close();
        assert!(worker.finish_close(LONG));
    }

    #[test]
    fn a_closed_worker_has_no_thread() {
        let worker: Worker<u32> = Worker::closed(4);
        assert!(matches!(worker.try_push(1), Pushed::Closed(1)));
        assert!(worker.finish_close(LONG));
        assert_eq!(flush(&worker), Some(true));
        assert!(!worker.is_worker_thread());
    }

    #[test]
    fn dropping_the_worker_drains_and_ends_the_thread() {
        let (worker, h) = collecting(8);
        for i in 0..8 {
            assert!(matches!(worker.try_push(i), Pushed::Queued));
        }
        let thread = worker.take_thread().unwrap();
        drop(worker);
        thread.join().unwrap();
        assert_eq!(
            h.got.try_iter().collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_thread_started_later_handles_what_waited_in_order() {
        let worker = Worker::new(4);
        for i in 0..3 {
            assert!(matches!(worker.try_push(i), Pushed::Queued));
        }
        assert!(!worker.has_thread());
        assert_eq!(worker.pending(), 3);
        let (sink, h) = collector();
        worker.start(sink, "test-late").unwrap();
        assert!(worker.has_thread());
        // A second start changes nothing (its sink is dropped unused).
        let (other, other_h) = collector();
        worker.start(other, "test-late-2").unwrap();
        assert_eq!(flush(&worker), Some(true));
        assert_eq!(h.got.try_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(other_h.got.try_iter().count(), 0);
    }

    #[test]
    fn a_closed_queue_starts_no_thread() {
        let worker: Worker<u32> = Worker::new(4);
        worker.begin_close();
        worker.start(Stopper, "test-closed").unwrap();
        assert!(!worker.has_thread());
        assert!(matches!(worker.try_push(1), Pushed::Closed(1)));
    }

    #[test]
    fn take_queued_returns_what_the_thread_has_not_taken() {
        let (worker, h) = collecting(8);
        let closed_gate = h.gate.lock();
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        // The worker holds item 0, blocked on the gate.
        assert_eq!(h.started.recv_timeout(LONG), Ok(0));
        for i in 1..4 {
            assert!(matches!(worker.try_push(i), Pushed::Queued));
        }
        assert_eq!(worker.take_queued(), vec![1, 2, 3]);
        // Only the item in hand is still pending.
        assert_eq!(worker.pending(), 1);
        assert!(!worker.wait_idle(Duration::from_millis(20)));
        drop(closed_gate);
        assert!(worker.wait_idle(LONG));
        assert_eq!(h.got.try_iter().collect::<Vec<_>>(), vec![0]);
        assert_eq!((worker.handled(), worker.dropped()), (1, 0));
        assert!(worker.take_queued().is_empty());
    }

    #[test]
    fn a_close_waits_only_for_the_item_in_hand_once_the_rest_is_taken_back() {
        let (worker, h) = collecting(8);
        let closed_gate = h.gate.lock();
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        assert_eq!(h.started.recv_timeout(LONG), Ok(0));
        assert!(matches!(worker.try_push(1), Pushed::Queued));
        worker.begin_close();
        let worker = Arc::new(worker);
        let closer = {
            let worker = Arc::clone(&worker);
            // Sends `Stop` once item 0 is handled and 1 taken back.
            std::thread::spawn(move || worker.finish_close(LONG))
        };
        assert_eq!(worker.take_queued(), vec![1]);
        drop(closed_gate);
        assert!(closer.join().unwrap());
        assert!(worker.is_stopped());
        assert_eq!(h.got.try_iter().collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn take_dropped_counts_from_zero_again() {
        let worker: Worker<u32> = Worker::new(1);
        assert!(matches!(worker.try_push(0), Pushed::Queued));
        assert!(matches!(worker.try_push(1), Pushed::Full(1)));
        worker.add_dropped(1);
        assert_eq!(worker.take_dropped(), 1);
        assert_eq!(worker.take_dropped(), 0);
        assert_eq!(worker.dropped(), 0);
    }
}
