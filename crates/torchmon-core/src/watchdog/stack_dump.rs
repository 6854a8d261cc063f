//! The stacks of a hang: CPython's faulthandler, registered by the embedder
//! for one signal on a file descriptor (`set_stack_dumper`), writes every
//! Python thread's stack when that signal is raised. A dump points the
//! descriptor at the dump file (`dup2`) and raises the signal on the
//! watchdog's own thread, so the handler has run when `raise` returns; the
//! stacks are taken even while a C call holds the GIL.
//!
//! faulthandler walks the interpreter's thread states without taking the
//! GIL. A thread state is unlinked by its ending thread while that thread
//! holds the GIL, and freed right after it released it: a walk while nobody
//! holds the GIL can read a freed thread state (a process whose loader or
//! I/O pools start and end threads died of SIGSEGV in the dump). So the
//! walk runs while some thread holds the GIL, during which no thread state
//! is unlinked:
//!
//! - a helper thread takes the GIL (the embedder's `InterpreterLock`)
//!   and holds it while the watchdog's thread raises the signal: "holding
//!   the GIL";
//! - if the helper has not had it for `GIL_WAIT`, another thread holds it
//!   (a C call that keeps it, the hang being watched): the watchdog's
//!   thread dumps without it, and the helper, if it gets the GIL before the
//!   dump ends, holds it until then. The helper starts a poll before a hang
//!   is due (`Probe`), so that this is known when the hang is found. One
//!   helper at most runs.
//!
//! The dump file's header says which path was taken.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::fork_safe::ForkSafeMutex;

/// How long the helper must have been without the GIL for a dump to go
/// without it. A loaded machine with dozens of Python threads passes the
/// GIL around in well under this; a C call that keeps it keeps it longer.
pub const GIL_WAIT: Duration = Duration::from_millis(500);

/// The embedder's interpreter lock (the GIL), for the helper thread:
/// `attach(body)` attaches the calling thread (a thread state made once,
/// the lock taken), runs `body`, detaches; false (`body` not run) when it
/// cannot attach (the interpreter is finalizing). Inside `body`,
/// `release(f)` runs `f` with the lock released and takes it back, the
/// thread state kept: the helper takes and releases the GIL many times
/// while making one thread state. (Making one takes the interpreter's
/// thread-list lock without the GIL, and CPython 3.9 and 3.10 hang a child
/// forked while another thread holds that lock.)
#[derive(Clone, Copy)]
pub struct InterpreterLock {
    pub attach: fn(&mut dyn FnMut()) -> bool,
    pub release: fn(&mut (dyn FnMut() + Send)),
}

/// The process's faulthandler registration.
#[derive(Clone, Copy)]
struct Registration {
    signal: i32,
    /// The descriptor faulthandler writes to; between dumps a copy of what
    /// it was given (`/dev/null`).
    target_fd: i32,
    idle_fd: i32,
    /// faulthandler's handler as installed: another one found at a dump
    /// (removed, or replaced by a handler of the program's) gets no raise.
    handler: libc::sighandler_t,
    hold: Option<InterpreterLock>,
}

/// One per process: faulthandler holds one descriptor per signal. Its lock
/// also keeps two watchdogs' dumps apart. Held by the watchdog's thread for
/// the length of a dump, so a forked child gets a new one
/// (`reset_after_fork`).
static REGISTRATION: ForkSafeMutex<Option<Registration>> = ForkSafeMutex::new(|| None);

/// The line about a missing or replaced handler was written to stderr.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Sets where stacks are dumped: faulthandler was registered for `signal` on
/// `target_fd` (all threads), just now. The descriptor is duplicated, so
/// that it can be pointed back at what it was after each dump. `hold` takes
/// the GIL for the dumps (`None`: dumps never hold it).
pub fn set_stack_dumper(
    signal: i32,
    target_fd: i32,
    hold: Option<InterpreterLock>,
) -> std::io::Result<()> {
    // SAFETY: `dup` only reads the descriptor table; an invalid descriptor
    // gives -1, handled below.
    let idle_fd = unsafe { libc::dup(target_fd) };
    if idle_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let previous = REGISTRATION.lock().replace(Registration {
        signal,
        target_fd,
        idle_fd,
        handler: installed_handler(signal),
        hold,
    });
    if let Some(previous) = previous {
        // SAFETY: `idle_fd` was made by `dup` above for this table entry
        // and is used by nobody else once the entry is replaced.
        unsafe { libc::close(previous.idle_fd) };
    }
    Ok(())
}

/// The handler installed for `signal` now (`SIG_DFL` if it cannot be read).
fn installed_handler(signal: i32) -> libc::sighandler_t {
    // SAFETY: an all-zero sigaction is a valid value to be overwritten, and
    // with a null new action `sigaction` only reads the current one into it.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above: `current` is exclusively borrowed, `act` is null.
    let status = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) };
    if status != 0 {
        return libc::SIG_DFL;
    }
    current.sa_sigaction
}

/// Whether a C handler other than the default is installed for `signal`
/// (a handler faulthandler would silently replace).
pub fn signal_is_taken(signal: i32) -> bool {
    installed_handler(signal) != libc::SIG_DFL
}

/// Writes every Python thread's stack into `file` through the registered
/// faulthandler, after a line saying how they were taken; or a line saying
/// why there are none.
pub(super) fn dump_stacks(file: &mut File) -> std::io::Result<()> {
    let registration = REGISTRATION.lock();
    let Some(registration) = registration.as_ref() else {
        return writeln!(file, "(no stack dumper registered)");
    };
    let signal = registration.signal;
    let handler = installed_handler(signal);
    if handler != registration.handler {
        let what = if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            "was removed"
        } else {
            "was replaced by another handler"
        };
        let why = format!(
            "(no stacks: the handler of the dump signal {signal} that faulthandler installed \
             {what}; the watchdog does not raise it)"
        );
        if !WARNED.swap(true, Ordering::Relaxed) {
            eprintln!("torchmon: {why}; later dumps hold no stacks until a new Watchdog registers");
        }
        return writeln!(file, "{why}");
    }
    let holder = registration.hold.and_then(Holder::start);
    let held = holder
        .as_ref()
        .is_some_and(|holder| holder.wait_held(GIL_WAIT));
    let path = if held {
        "Taken holding the GIL (no thread state can be made or freed meanwhile)."
    } else if registration.hold.is_none() {
        "Taken without the GIL (no interpreter lock registered)."
    } else {
        "Taken without the GIL, which another thread holds (a call that keeps it): \
         no thread state can be freed meanwhile."
    };
    writeln!(file, "{path}\n")?;
    raise_into(registration, file);
    drop(holder);
    Ok(())
}

/// Raises the dump signal with faulthandler's descriptor pointed at `file`.
fn raise_into(registration: &Registration, file: &File) {
    unblock(registration.signal);
    // SAFETY: both descriptors are open (the file is borrowed for the call;
    // `target_fd` is held open by the embedder's faulthandler registration,
    // `idle_fd` by the registration). `dup2` replaces `target_fd`
    // atomically, and the only other user of `target_fd` is faulthandler's
    // handler, which runs only for the signal raised here, on this thread,
    // while the registration's lock keeps other dumps out. `raise` delivers
    // to the calling thread, whose mask `unblock` has just cleared of the
    // signal (the core's threads start with it blocked: crate::threads), so
    // the handler has run when it returns.
    unsafe {
        if libc::dup2(file.as_raw_fd(), registration.target_fd) < 0 {
            return;
        }
        libc::raise(registration.signal);
        libc::dup2(registration.idle_fd, registration.target_fd);
    }
}

/// Unblocks `signal` for the calling thread (a thread inherits its
/// creator's mask, which a program may have set).
pub(super) fn unblock(signal: i32) {
    // SAFETY: the set is initialised by `sigemptyset` before use, and
    // `pthread_sigmask` only changes the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// The registered dump signal, if any.
pub(super) fn dump_signal() -> Option<i32> {
    REGISTRATION
        .lock()
        .as_ref()
        .map(|registration| registration.signal)
}

/// How long an armed probe keeps going without a dump: until past the
/// hang it was armed for (`arm_ahead`).
const ARMED_FOR: Duration = Duration::from_millis(700);

/// How long before a hang is due the probe is armed: long enough that a
/// GIL held since the last beat has been out of its reach for `GIL_WAIT`
/// when the hang is found.
pub(super) fn arm_ahead() -> Duration {
    GIL_WAIT + Duration::from_millis(super::POLL_MS)
}

/// The helper thread that takes the GIL for dumps: armed a poll before a
/// hang is due (`arm`), it takes and releases the GIL every few
/// milliseconds, noting when it last had it, so that a dump knows at once
/// whether the GIL is free (the helper holds it for the dump) or has been
/// held elsewhere for `GIL_WAIT` already (the dump goes without it, not
/// `GIL_WAIT` later: a peer rank's exit may end this process meanwhile).
struct Probe {
    state: Mutex<ProbeState>,
    changed: Condvar,
}

struct ProbeState {
    started: Instant,
    armed_until: Instant,
    last_held: Option<Instant>,
    /// The helper could not take the GIL (the interpreter is finalizing).
    refused: bool,
    /// Dumps asked for, and the last one the helper holds the GIL for.
    requested: u64,
    held_for: u64,
    /// The last dump done: the helper may release the GIL.
    released: u64,
    /// Set by `stop_probe`: the helper ends at its next look.
    stopped: bool,
    /// Set by the helper as it ends.
    ended: bool,
}

/// The probe of this process, while its helper runs. Replaced in a forked
/// child, where the helper does not exist.
static PROBE: ForkSafeMutex<Option<Arc<Probe>>> = ForkSafeMutex::new(|| None);

/// Starts (or extends) the probe, so that a dump due within `ARMED_FOR`
/// finds it running. Nothing without a registered interpreter lock.
pub(super) fn arm() {
    let hold = match REGISTRATION.try_lock() {
        Some(registration) => registration.as_ref().and_then(|r| r.hold),
        // A dump holds it: it armed the probe itself.
        None => return,
    };
    if let Some(hold) = hold {
        armed(hold);
    }
}

fn armed(hold: InterpreterLock) -> Option<Arc<Probe>> {
    let mut current = PROBE.lock();
    let now = Instant::now();
    if let Some(probe) = current.as_ref() {
        probe.state.lock().armed_until = now + ARMED_FOR;
        return Some(Arc::clone(probe));
    }
    let probe = Arc::new(Probe {
        state: Mutex::new(ProbeState {
            started: now,
            armed_until: now + ARMED_FOR,
            last_held: None,
            refused: false,
            requested: 0,
            held_for: 0,
            released: 0,
            stopped: false,
            ended: false,
        }),
        changed: Condvar::new(),
    });
    let helper = Arc::clone(&probe);
    let builder = std::thread::Builder::new().name("torchmon-wd-gil".into());
    crate::threads::spawn(builder, move || {
        probe_gil(&helper, hold);
        helper.state.lock().ended = true;
        helper.changed.notify_all();
    })
    .ok()?;
    *current = Some(Arc::clone(&probe));
    Some(probe)
}

/// The helper: attached once, it notes each time it has the GIL, holds it
/// while a dump asks, and releases it for 2 ms at a time; until disarmed
/// with no dump waiting, or stopped.
fn probe_gil(probe: &Arc<Probe>, lock: InterpreterLock) {
    let attached = (lock.attach)(&mut || {
        loop {
            {
                let mut state = probe.state.lock();
                state.last_held = Some(Instant::now());
                if state.requested > state.released {
                    state.held_for = state.requested;
                    probe.changed.notify_all();
                    while state.released < state.held_for {
                        probe.changed.wait(&mut state);
                    }
                }
            }
            if probe_ends(probe) {
                return;
            }
            let pause = &mut || std::thread::sleep(Duration::from_millis(2));
            (lock.release)(pause);
        }
    });
    if !attached {
        probe.state.lock().refused = true;
        probe.changed.notify_all();
        probe_ends(probe);
    }
}

/// Whether the helper ends now (disarmed with no dump waiting, stopped, or
/// refused); if so, the probe is no longer the process's.
fn probe_ends(probe: &Arc<Probe>) -> bool {
    let mut current = PROBE.lock();
    let state = probe.state.lock();
    let idle = state.requested == state.released;
    let ends = state.stopped || state.refused || (idle && Instant::now() >= state.armed_until);
    if ends
        && current
            .as_ref()
            .is_some_and(|live| Arc::ptr_eq(live, probe))
    {
        *current = None;
    }
    ends
}

/// Stops the probe and waits (at most `wait`) until its helper no longer
/// runs: called as a watchdog closes, before the interpreter ends (a helper
/// taking the GIL back after that would be ended by CPython inside Rust
/// frames). A dump armed later starts a new one.
pub(super) fn stop_probe(wait: Duration) {
    let Some(probe) = PROBE.lock().take() else {
        return;
    };
    let deadline = Instant::now() + wait;
    let mut state = probe.state.lock();
    state.stopped = true;
    probe.changed.notify_all();
    while !state.ended && Instant::now() < deadline {
        probe.changed.wait_until(&mut state, deadline);
    }
}

/// A dump's hold of the GIL through the probe; dropped when the dump is
/// done, which lets the helper release it.
struct Holder {
    probe: Arc<Probe>,
    dump: u64,
}

impl Holder {
    /// Asks the probe (armed now if it was not) to hold the GIL for a dump.
    fn start(hold: InterpreterLock) -> Option<Holder> {
        let probe = armed(hold)?;
        let dump = {
            let mut state = probe.state.lock();
            state.requested += 1;
            state.requested
        };
        Some(Holder { probe, dump })
    }

    /// Whether the helper holds the GIL for this dump: waited for until
    /// the GIL was out of the helper's reach for `wait` (counted from when
    /// it last had it, or from its start).
    fn wait_held(&self, wait: Duration) -> bool {
        let mut state = self.probe.state.lock();
        while state.held_for < self.dump && !state.refused {
            let deadline = state.last_held.unwrap_or(state.started) + wait;
            if Instant::now() >= deadline {
                break;
            }
            self.probe.changed.wait_until(&mut state, deadline);
        }
        state.held_for >= self.dump
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let mut state = self.probe.state.lock();
        state.released = state.released.max(self.dump);
        self.probe.changed.notify_all();
    }
}

/// In a forked child (`fork::after_fork_in_child`): the registration under
/// a new lock (the watchdog's thread may have held the old one in a dump),
/// faulthandler's descriptor pointed back at its idle target (a dump in
/// progress had pointed it at the parent's file), and no probe.
pub(crate) fn reset_after_fork() {
    let carry = |old: Option<&Option<Registration>>| {
        let registration = old?.as_ref()?;
        // SAFETY: both descriptors were open in the parent and a child
        // inherits them; a dump in progress at the fork had `target_fd`
        // pointed at its file, and this points it back.
        unsafe { libc::dup2(registration.idle_fd, registration.target_fd) };
        Some(*registration)
    };
    // SAFETY: called by `fork::after_fork_in_child`, on the forking thread
    // of a new child before it starts a thread, holding no guard; the
    // registration is only ever replaced whole under the lock (and only
    // read by a dump), so the parent left it whole.
    unsafe { REGISTRATION.replace_in_child(carry) };
    // SAFETY: as above; the old probe is not read (its helper is the
    // parent's).
    unsafe { PROBE.replace_in_child(|_| None) };
}
