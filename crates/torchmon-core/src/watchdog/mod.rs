//! The hang watchdog behind `torchmon.Watchdog` (docs/watchdog.md): a step
//! counter that the training thread bumps (`beat`), and a thread of its own
//! that decides, without Python and without the GIL, that the beats stopped
//! for longer than the timeout, writes every Python thread's stack to a file
//! and tells the embedder.
//!
//! The timeout is `max(min_timeout, factor * p99 of the recent beat
//! intervals)`, capped by `max_timeout` when one is given; until
//! `warmup_beats` beats happened (the first steps compile) it is
//! `first_timeout`, and the intervals of those beats are not kept. A pause
//! (`pause`/`resume`, a checkpoint) stops the clock: the time paused never
//! counts, nor the interval that spans it; nor does the interval of a
//! reported hang.
//!
//! The stacks are written by CPython's faulthandler (`stack_dump`), even
//! while a C call holds the GIL; sections are timed per thread, and a hang
//! names the open section of the thread that beat last (`sections`).
//!
//! Fork: a child has a copy of each `Watchdog` but not its thread; every
//! watchdog carries the pid that started it, and in another process it
//! neither reports nor joins (`close`) nor shows in the beat-age gauge. The
//! process-wide locks its threads take are replaced in the child
//! (`reset_after_fork`).

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::clock;
use crate::fork_safe::ForkSafeMutex;

mod sections;
mod stack_dump;

pub use sections::Sections;
pub use stack_dump::{GIL_WAIT, InterpreterLock, set_stack_dumper, signal_is_taken};

/// The beat intervals kept for the p99: the last this many.
pub const KEPT_INTERVALS: usize = 1024;

/// How often the watchdog's thread looks at the beats.
pub const POLL_MS: u64 = 100;

/// A watchdog's settings, in milliseconds of the monotonic clock (`clock`).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub min_timeout_ms: i64,
    pub factor: f64,
    pub max_timeout_ms: Option<i64>,
    pub first_timeout_ms: i64,
    pub warmup_beats: u64,
    /// Exit the process with this code after a hang's dump: the report
    /// exits itself once it delivered the hang; if it did not within
    /// `EXIT_GRACE` (a C call holding the GIL keeps it out), the watchdog's
    /// thread ends the process.
    pub exit_code: Option<i32>,
}

/// How long a report may take to exit the process itself (`Config::exit_code`).
pub const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Why a watchdog's settings were refused: the argument and what it must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidConfig {
    pub argument: &'static str,
    pub must: &'static str,
}

impl Config {
    /// Checks the settings given in seconds (`None`: not given) and returns
    /// them in milliseconds. `first_timeout` defaults to ten times
    /// `min_timeout`, at least 5 minutes.
    pub fn from_seconds(
        min_timeout: f64,
        factor: f64,
        max_timeout: Option<f64>,
        first_timeout: Option<f64>,
        warmup_beats: u64,
    ) -> Result<Config, InvalidConfig> {
        let positive = |argument, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(InvalidConfig {
                    argument,
                    must: "must be a positive finite number",
                })
            }
        };
        let ms = |seconds: f64| (seconds * 1000.0).clamp(1.0, i64::MAX as f64 / 4.0) as i64;
        let min_timeout_ms = ms(positive("min_timeout", min_timeout)?);
        let factor = positive("factor", factor)?;
        let max_timeout_ms = match max_timeout {
            Some(value) => Some(ms(positive("max_timeout", value)?)),
            None => None,
        };
        if max_timeout_ms.is_some_and(|max| max < min_timeout_ms) {
            return Err(InvalidConfig {
                argument: "max_timeout",
                must: "must be at least min_timeout",
            });
        }
        let first_timeout_ms = match first_timeout {
            Some(value) => ms(positive("first_timeout", value)?),
            None => (min_timeout_ms.saturating_mul(10)).max(300_000),
        };
        Ok(Config {
            min_timeout_ms,
            factor,
            max_timeout_ms,
            first_timeout_ms,
            warmup_beats,
            exit_code: None,
        })
    }
}

/// What the watchdog tells the embedder, from its own thread.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// The beats stopped for `stalled_ms` (more than `timeout_ms`); `section`
    /// is the open section ("" if none); `dump` the stack file written, if
    /// any.
    Hang {
        stalled_ms: i64,
        timeout_ms: i64,
        section: String,
        dump: Option<PathBuf>,
        beats: u64,
    },
    /// Beats came back after a `Hang`: `stalled_ms` from the beat before it
    /// to the beat after it.
    Resumed { stalled_ms: i64, beats: u64 },
}

fn pid() -> u32 {
    std::process::id()
}

/// The state shared by the beating threads, the watchdog's thread and the
/// beat-age gauge.
pub struct Shared {
    config: Config,
    pid: u32,
    rank: i64,
    dump_dir: Option<PathBuf>,
    beats: AtomicU64,
    /// When the clock last restarted: the last beat, the start or the end
    /// of a pause.
    last_beat_ms: AtomicI64,
    /// Set by a resume: the next beat's interval spans a pause.
    skip_interval: AtomicBool,
    intervals: Box<[AtomicU32]>,
    next_interval: AtomicU64,
    paused: AtomicU32,
    sections: Sections,
    /// Set by `close`; an atomic, so that a forked child's `close` (whose
    /// copy of `sleeping` a parent thread may have held at the fork) takes
    /// no lock.
    stopped: AtomicBool,
    /// What the watchdog's thread sleeps on between two looks at the beats.
    sleeping: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    /// A watchdog's state at its start: no beat yet, the clock at `now_ms`.
    fn new(config: Config, rank: i64, dump_dir: Option<PathBuf>, now_ms: i64) -> Shared {
        Shared {
            config,
            pid: pid(),
            rank,
            dump_dir,
            beats: AtomicU64::new(0),
            last_beat_ms: AtomicI64::new(now_ms),
            skip_interval: AtomicBool::new(false),
            intervals: (0..KEPT_INTERVALS).map(|_| AtomicU32::new(0)).collect(),
            next_interval: AtomicU64::new(0),
            paused: AtomicU32::new(0),
            sections: Sections::default(),
            stopped: AtomicBool::new(false),
            sleeping: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// One step done.
    ///
    /// Loads and stores, no read-modify-write: a step is one thread's, and
    /// two threads beating at the same instant may count once, which only
    /// costs a count (either beat restarts the clock and changes the
    /// count the watchdog's thread compares).
    #[inline]
    pub fn beat(&self) {
        let now = clock::now_ms_for_window(clock::COARSE_CLOCK_MIN_WINDOW_MS);
        let previous = self.last_beat_ms.load(Ordering::Relaxed);
        self.last_beat_ms.store(now, Ordering::Relaxed);
        let beats = self.beats.load(Ordering::Relaxed) + 1;
        self.beats.store(beats, Ordering::Relaxed);
        self.sections.beat_on_this_thread(beats);
        if beats <= self.config.warmup_beats {
            return;
        }
        if self.skip_interval.load(Ordering::Relaxed) {
            self.skip_interval.store(false, Ordering::Relaxed);
            return;
        }
        let slot = self.next_interval.load(Ordering::Relaxed);
        self.next_interval.store(slot + 1, Ordering::Relaxed);
        let interval = (now - previous).clamp(0, u32::MAX as i64) as u32;
        self.intervals[slot as usize % KEPT_INTERVALS].store(interval, Ordering::Relaxed);
    }

    pub fn beats(&self) -> u64 {
        self.beats.load(Ordering::Relaxed)
    }

    /// Stops the clock until as many `resume`s.
    pub fn pause(&self) {
        self.paused.fetch_add(1, Ordering::AcqRel);
    }

    /// Restarts the clock from now; the interval spanning the pause is not
    /// kept.
    pub fn resume(&self) {
        let now = clock::now_ms_for_window(clock::COARSE_CLOCK_MIN_WINDOW_MS);
        self.last_beat_ms.store(now, Ordering::Relaxed);
        self.skip_interval.store(true, Ordering::Relaxed);
        let _ = (self.paused).fetch_update(Ordering::AcqRel, Ordering::Acquire, |depth| {
            depth.checked_sub(1)
        });
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire) > 0
    }

    /// The sections, timed per thread.
    pub fn sections(&self) -> &Sections {
        &self.sections
    }

    /// The section a hang names now ("" if none).
    pub fn open_section(&self) -> String {
        self.sections.hung_section()
    }

    /// The p99 of the kept beat intervals, if any was kept.
    pub fn p99_interval_ms(&self) -> Option<i64> {
        let kept = (self.next_interval.load(Ordering::Relaxed) as usize).min(KEPT_INTERVALS);
        if kept == 0 {
            return None;
        }
        let mut intervals: Vec<u32> = self.intervals[..kept]
            .iter()
            .map(|interval| interval.load(Ordering::Relaxed))
            .collect();
        intervals.sort_unstable();
        // The nearest rank: the smallest interval at or above 99 % of them.
        let rank = (kept * 99).div_ceil(100).max(1);
        Some(i64::from(intervals[rank - 1]))
    }

    /// The timeout now, in milliseconds.
    pub fn timeout_ms(&self) -> i64 {
        let config = &self.config;
        if self.beats() <= config.warmup_beats {
            return config.first_timeout_ms;
        }
        let scaled = match self.p99_interval_ms() {
            Some(p99) => (p99 as f64 * config.factor).min(i64::MAX as f64 / 4.0) as i64,
            None => 0,
        };
        let timeout = scaled.max(config.min_timeout_ms);
        match config.max_timeout_ms {
            Some(max) => timeout.min(max),
            None => timeout,
        }
    }

    /// Milliseconds since the clock last restarted (0 while paused).
    pub fn stalled_ms(&self) -> i64 {
        if self.is_paused() {
            return 0;
        }
        let now = clock::now_ms_for_window(clock::COARSE_CLOCK_MIN_WINDOW_MS);
        (now - self.last_beat_ms.load(Ordering::Relaxed)).max(0)
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Writes the dump file: a header, then the stacks. `None` (and one line
    /// on stderr) if the file cannot be written.
    fn write_dump(&self, stalled_ms: i64, timeout_ms: i64, section: &str) -> Option<PathBuf> {
        let dir = self.dump_dir.as_ref()?;
        let mut path = dir.join(format!("hang-rank{}-pid{}-N.txt", self.rank, self.pid));
        let mut created_file = false;
        let written = std::fs::create_dir_all(dir).and_then(|()| {
            let (mut file, created) = create_dump_file(dir, self.rank, self.pid)?;
            path = created;
            created_file = true;
            writeln!(
                file,
                "torchmon watchdog: rank {} (pid {}) made no step for {:.1} s \
                 (timeout {:.1} s), in section {:?}, after {} steps.\n\
                 Stacks of every Python thread, most recent call first.",
                self.rank,
                self.pid,
                stalled_ms as f64 / 1000.0,
                timeout_ms as f64 / 1000.0,
                section,
                self.beats(),
            )?;
            stack_dump::dump_stacks(&mut file)
        });
        match written {
            Ok(()) => Some(path),
            Err(err) => {
                // Not a file that looks like a dump and holds nothing (a
                // full disk): the file this dump created goes.
                if created_file {
                    let _ = std::fs::remove_file(&path);
                }
                eprintln!(
                    "torchmon: the watchdog could not write its dump to {}: {err}",
                    path.display()
                );
                None
            }
        }
    }
}

/// The next dump's number in this process: one sequence for every watchdog
/// of the process, so that two never name the same file.
static NEXT_DUMP: AtomicU64 = AtomicU64::new(1);

/// A new dump file `hang-rank{rank}-pid{pid}-{n}.txt` in `dir`, never one
/// that exists (a restarted job in a container may reuse a pid): the next
/// free `n` of the process's sequence.
fn create_dump_file(
    dir: &std::path::Path,
    rank: i64,
    pid: u32,
) -> std::io::Result<(File, PathBuf)> {
    let mut attempts = 0;
    loop {
        let sequence = NEXT_DUMP.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("hang-rank{rank}-pid{pid}-{sequence}.txt"));
        match File::options().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && attempts < 10_000 => {
                attempts += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

/// The process's watchdogs, for the beat-age gauge.
/// Held by the Prometheus server's thread while it renders, so a forked
/// child gets a new one (`reset_after_fork`).
static WATCHDOGS: ForkSafeMutex<Vec<Weak<Shared>>> = ForkSafeMutex::new(Vec::new);

/// In a forked child (`fork::after_fork_in_child`): the watchdog locks that
/// the parent's threads take without the GIL are replaced (the list of
/// watchdogs starts empty: the parent's run in the parent), and the dump
/// registration is carried over (`stack_dump::reset_after_fork`).
pub(crate) fn reset_after_fork() {
    // SAFETY: called by `fork::after_fork_in_child`, on the forking thread
    // of a new child before it starts a thread, holding no guard; the old
    // list is not read.
    unsafe { WATCHDOGS.replace_in_child(|_| Vec::new()) };
    stack_dump::reset_after_fork();
}

/// The longest time in seconds since a beat over this process's running
/// watchdogs, or `None` without one: the gauge a scrape renders without
/// Python (`prometheus`).
pub fn seconds_since_beat() -> Option<f64> {
    let watchdogs = WATCHDOGS.try_lock()?;
    let here = pid();
    watchdogs
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|shared| shared.pid == here && !shared.is_stopped())
        .map(|shared| shared.stalled_ms() as f64 / 1000.0)
        .reduce(f64::max)
}

/// A running watchdog: its shared state, its thread, and the thread that
/// delivers its reports.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    delivery: Mutex<Option<JoinHandle<()>>>,
    delivered: Arc<Done>,
}

/// How long `close` waits for the reports found before it to be delivered.
pub const DELIVERY_WAIT: Duration = Duration::from_secs(5);

/// Set once, by the delivering thread as it ends.
#[derive(Default)]
struct Done {
    done: Mutex<bool>,
    changed: Condvar,
}

impl Done {
    fn set(&self) {
        *self.done.lock() = true;
        self.changed.notify_all();
    }

    /// Whether it was set, waiting at most `wait`.
    fn wait(&self, wait: Duration) -> bool {
        let mut done = self.done.lock();
        if !*done {
            self.changed.wait_for(&mut done, wait);
        }
        *done
    }
}

impl Watchdog {
    /// Starts the watchdog: the clock runs from now. `report` is called for
    /// each hang and each resumption, in order, on a thread of its own: a
    /// report that waits (for the GIL held by a C call) never keeps the
    /// watchdog's thread from finding and dumping the next hang. `rank`
    /// names the dump files written under `dump_dir`.
    pub fn start(
        config: Config,
        rank: i64,
        dump_dir: Option<PathBuf>,
        report: impl Fn(Report) + Send + 'static,
    ) -> std::io::Result<Watchdog> {
        let now = clock::now_ms_for_window(clock::COARSE_CLOCK_MIN_WINDOW_MS);
        let shared = Arc::new(Shared::new(config, rank, dump_dir, now));
        let (sender, receiver) = std::sync::mpsc::channel::<Report>();
        let builder = std::thread::Builder::new().name("torchmon-wd-report".into());
        let delivered = Arc::new(Done::default());
        let done = Arc::clone(&delivered);
        let delivery = crate::threads::spawn(builder, move || {
            for found in receiver {
                report(found);
            }
            done.set();
        })?;
        let watched = Arc::clone(&shared);
        let builder = std::thread::Builder::new().name("torchmon-watchdog".into());
        let thread = crate::threads::spawn(builder, move || {
            watch(&watched, |found| {
                let _ = sender.send(found);
            })
        })?;
        let mut watchdogs = WATCHDOGS.lock();
        watchdogs.retain(|weak| weak.strong_count() > 0);
        watchdogs.push(Arc::downgrade(&shared));
        Ok(Watchdog {
            shared,
            thread: Mutex::new(Some(thread)),
            delivery: Mutex::new(Some(delivery)),
            delivered,
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the threads and waits for them (not in a forked child, which
    /// does not have them, nor from a report, on the delivering thread).
    /// The reports found before, if any, are delivered first.
    pub fn close(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        if self.shared.pid != pid() {
            // A forked child: the threads are the parent's, and so may be
            // the locks below (held by one of them at the fork).
            return;
        }
        // Taken and released, so that the thread either sees `stopped`
        // before it sleeps or is asleep and gets the notification.
        drop(self.shared.sleeping.lock());
        self.shared.wake.notify_all();
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        // Its GIL helper too, which must not outlive the interpreter (a
        // watchdog still running arms a new one).
        stack_dump::stop_probe(Duration::from_secs(1));
        // The watchdog's thread is gone, and with it the sender: the
        // delivering thread ends once it delivered what was sent, unless a
        // report is stuck (a handler waiting for a lock the closing thread
        // holds, at exit): then it is left behind after `DELIVERY_WAIT`.
        let delivery = self.delivery.lock().take();
        if let Some(delivery) = delivery
            && delivery.thread().id() != std::thread::current().id()
        {
            if self.delivered.wait(DELIVERY_WAIT) {
                let _ = delivery.join();
            } else {
                eprintln!(
                    "torchmon: a watchdog report (a handler of torchmon.hang or \
                     torchmon.resumed) did not finish within {} s; the watchdog closes \
                     without it",
                    DELIVERY_WAIT.as_secs()
                );
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.shared.is_stopped()
    }
}

/// The watchdog's thread: every `POLL_MS`, a hang once the beats stopped for
/// longer than the timeout, then a resumption once they come back.
fn watch(shared: &Shared, report: impl Fn(Report)) {
    if let Some(signal) = stack_dump::dump_signal() {
        stack_dump::unblock(signal);
    }
    // While a hang lasts: the beat count when it was reported, and when
    // its clock started.
    let mut hung_at: Option<(u64, i64)> = None;
    loop {
        {
            let mut sleeping = shared.sleeping.lock();
            if !shared.is_stopped() {
                shared
                    .wake
                    .wait_for(&mut sleeping, Duration::from_millis(POLL_MS));
            }
        }
        if shared.is_stopped() {
            // A beat that ended the hang just before `close`: its
            // resumption is still told.
            if let Some((at, since_ms)) = hung_at
                && shared.beats() != at
            {
                let resumed_ms = shared.last_beat_ms.load(Ordering::Relaxed);
                report(Report::Resumed {
                    stalled_ms: (resumed_ms - since_ms).max(0),
                    beats: shared.beats(),
                });
            }
            return;
        }
        if shared.is_paused() {
            continue;
        }
        let beats = shared.beats();
        match hung_at {
            Some((at, since_ms)) if beats != at => {
                hung_at = None;
                let resumed_ms = shared.last_beat_ms.load(Ordering::Relaxed);
                report(Report::Resumed {
                    stalled_ms: (resumed_ms - since_ms).max(0),
                    beats,
                });
            }
            Some(_) => {}
            None => {
                let stalled_ms = shared.stalled_ms();
                let timeout_ms = shared.timeout_ms();
                let ahead_ms = stack_dump::arm_ahead().as_millis() as i64;
                if shared.dump_dir.is_some() && stalled_ms + ahead_ms >= timeout_ms {
                    // The next look may find a hang: its dump should know
                    // by then whether the GIL can be had.
                    stack_dump::arm();
                }
                if stalled_ms > timeout_ms {
                    let since_ms = shared.last_beat_ms.load(Ordering::Relaxed);
                    hung_at = Some((beats, since_ms));
                    // The interval the beat ending this hang closes is not
                    // a step time: kept, it would make the timeout `factor`
                    // times the hang for as long as it is in the p99.
                    shared.skip_interval.store(true, Ordering::Relaxed);
                    let section = shared.open_section();
                    let dump = shared.write_dump(stalled_ms, timeout_ms, &section);
                    if let Some(code) = shared.config.exit_code {
                        exit_after_grace(code);
                    }
                    report(Report::Hang {
                        stalled_ms,
                        timeout_ms,
                        section,
                        dump,
                        beats,
                    });
                }
            }
        }
    }
}

/// Ends the process with `code` after `EXIT_GRACE`, unless the report
/// ended it first.
fn exit_after_grace(code: i32) {
    let builder = std::thread::Builder::new().name("torchmon-watchdog-exit".into());
    let _ = crate::threads::spawn(builder, move || {
        std::thread::sleep(EXIT_GRACE);
        eprintln!(
            "torchmon: the watchdog's hang report did not finish within {} s; \
             exiting with code {code}",
            EXIT_GRACE.as_secs()
        );
        // SAFETY: `_exit` ends the process without running any handler
        // of this process, which is the point: the process is wedged.
        unsafe { libc::_exit(code) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_seconds(10.0, 5.0, None, None, 2).unwrap()
    }

    #[test]
    fn settings_are_checked_by_argument() {
        let refused = |min, factor, max, first| {
            Config::from_seconds(min, factor, max, first, 0)
                .unwrap_err()
                .argument
        };
        assert_eq!(refused(0.0, 5.0, None, None), "min_timeout");
        assert_eq!(refused(f64::NAN, 5.0, None, None), "min_timeout");
        assert_eq!(refused(1.0, f64::INFINITY, None, None), "factor");
        assert_eq!(refused(1.0, -1.0, None, None), "factor");
        assert_eq!(refused(10.0, 5.0, Some(5.0), None), "max_timeout");
        assert_eq!(refused(1.0, 5.0, None, Some(0.0)), "first_timeout");
        let config = config();
        assert_eq!(config.min_timeout_ms, 10_000);
        assert_eq!(config.first_timeout_ms, 300_000);
    }

    fn shared(config: Config) -> Shared {
        Shared::new(config, 0, None, 0)
    }

    #[test]
    fn the_timeout_is_the_first_one_until_the_warmup_beats_then_factor_times_p99() {
        let shared = shared(config());
        assert_eq!(shared.timeout_ms(), 300_000);
        shared.beat();
        shared.beat();
        // Past the warmup, no interval kept yet: the minimum.
        assert_eq!(shared.timeout_ms(), 300_000);
        shared.beat();
        assert_eq!(shared.p99_interval_ms().map(|p| p >= 0), Some(true));
        assert_eq!(shared.timeout_ms(), 10_000);
        for (slot, interval) in (0..100)
            .map(|i| if i == 99 { 3_000 } else { 100 })
            .enumerate()
        {
            shared.intervals[slot].store(interval, Ordering::Relaxed);
        }
        shared.next_interval.store(100, Ordering::Relaxed);
        // 100 intervals: the 99th smallest is a 100 ms one.
        assert_eq!(shared.p99_interval_ms(), Some(100));
        shared.intervals[98].store(4_000, Ordering::Relaxed);
        assert_eq!(shared.p99_interval_ms(), Some(3_000));
        assert_eq!(shared.timeout_ms(), 15_000);
    }

    #[test]
    fn max_timeout_caps_the_scaled_timeout() {
        let shared = shared(Config::from_seconds(1.0, 5.0, Some(2.0), None, 0).unwrap());
        shared.intervals[0].store(60_000, Ordering::Relaxed);
        shared.next_interval.store(1, Ordering::Relaxed);
        shared.beats.store(1, Ordering::Relaxed);
        assert_eq!(shared.timeout_ms(), 2_000);
    }

    #[test]
    fn a_pause_stops_the_clock_and_its_interval_is_not_kept() {
        let shared = shared(Config::from_seconds(1.0, 5.0, None, None, 0).unwrap());
        shared.pause();
        assert!(shared.is_paused());
        assert_eq!(shared.stalled_ms(), 0);
        shared.resume();
        assert!(!shared.is_paused());
        shared.beat();
        assert_eq!(shared.next_interval.load(Ordering::Relaxed), 0);
        shared.beat();
        assert_eq!(shared.next_interval.load(Ordering::Relaxed), 1);
        // An unmatched resume leaves the depth at 0.
        shared.resume();
        assert!(!shared.is_paused());
    }

    #[test]
    fn sections_nest_and_are_named_once() {
        let shared = shared(config());
        let sections = shared.sections();
        let data = sections.index("data");
        let compute = sections.index("compute");
        assert_eq!(sections.index("data"), data);
        assert_eq!(shared.open_section(), "");
        sections.enter(compute);
        sections.enter(data);
        assert_eq!(shared.open_section(), "data");
        sections.exit(data).unwrap();
        assert_eq!(shared.open_section(), "compute");
        sections.exit(compute).unwrap();
        assert_eq!(shared.open_section(), "");
    }

    #[test]
    fn a_stall_is_reported_once_then_its_end() {
        let config = Config::from_seconds(0.2, 5.0, None, Some(0.2), 0).unwrap();
        let dir = std::env::temp_dir().join(format!("torchmon-watchdog-test-{}", pid()));
        let (sender, receiver) = std::sync::mpsc::channel();
        let watchdog = Watchdog::start(config, 7, Some(dir.clone()), move |report| {
            let _ = sender.send(report);
        })
        .unwrap();
        let sections = watchdog.shared().sections();
        sections.enter(sections.index("compute"));
        let hang = receiver.recv_timeout(Duration::from_secs(5)).unwrap();
        let Report::Hang {
            stalled_ms,
            section,
            dump,
            ..
        } = hang
        else {
            panic!("expected a hang, got {hang:?}");
        };
        assert!(stalled_ms > 200, "{stalled_ms}");
        assert_eq!(section, "compute");
        let dump = dump.expect("a dump file");
        let text = std::fs::read_to_string(&dump).unwrap();
        assert!(text.contains("rank 7"), "{text}");
        assert!(text.contains("no stack dumper registered"), "{text}");
        assert!(seconds_since_beat().unwrap() > 0.2);
        // Still stalled: no second report.
        assert!(receiver.recv_timeout(Duration::from_millis(400)).is_err());
        watchdog.shared().beat();
        let resumed = receiver.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            matches!(resumed, Report::Resumed { beats: 1, .. }),
            "{resumed:?}"
        );
        // The hang's interval is not a step time.
        assert_eq!(watchdog.shared().p99_interval_ms(), None);
        watchdog.close();
        assert!(watchdog.is_closed());
        let _ = std::fs::remove_dir_all(dir);
    }
}
