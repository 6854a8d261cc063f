//! Starting the core's threads. Each starts with the asynchronous signals
//! blocked (SIGTERM, SIGINT, SIGHUP, SIGUSR1, ...: all but the ones a fault
//! raises in the faulting thread), so that the kernel delivers a signal sent
//! to the process to a thread that can act on it. CPython runs Python signal
//! handlers on the main thread only: a signal that the kernel hands to one
//! of ours trips the handler's flag there, and a main thread asleep in a
//! system call (`time.sleep`, a blocking read) is not woken, so the handler
//! (`flush_on_signals`, a job's own SIGTERM handler) waits until the call
//! returns by itself (docs/reliability.md, "Signals and torchmon's threads").

use std::io;
use std::thread::{Builder, JoinHandle};

/// `builder.spawn(f)`, the new thread with the asynchronous signals blocked.
/// They are blocked in the calling thread for the spawn only (a thread
/// starts with its creator's mask), so that none reaches the new thread
/// before it could block them itself; one arriving meanwhile stays pending
/// for the process until a thread that does not block it takes it.
pub fn spawn<F, T>(builder: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let _blocked = BlockedForSpawn::new();
    builder.spawn(f)
}

/// The signals a fault raises in the faulting thread: blocked, the process
/// would be killed without its handler (faulthandler's) running.
#[cfg(unix)]
const SYNCHRONOUS: [libc::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// The calling thread's signal mask with every asynchronous signal added,
/// restored on drop.
struct BlockedForSpawn {
    #[cfg(unix)]
    previous: libc::sigset_t,
}

impl BlockedForSpawn {
    #[cfg(unix)]
    fn new() -> Self {
        // SAFETY: both sets are initialised (`sigfillset`, then written by
        // `pthread_sigmask`) before they are read; `pthread_sigmask` changes
        // only the calling thread's mask, which `drop` restores.
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut block);
            for signal in SYNCHRONOUS {
                libc::sigdelset(&mut block, signal);
            }
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut previous);
            BlockedForSpawn { previous }
        }
    }

    #[cfg(not(unix))]
    fn new() -> Self {
        BlockedForSpawn {}
    }
}

impl Drop for BlockedForSpawn {
    fn drop(&mut self) {
        // SAFETY: `previous` is the mask `pthread_sigmask` returned in `new`,
        // on this same thread (the guard never leaves it).
        #[cfg(unix)]
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut());
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn blocked_now() -> libc::sigset_t {
        // SAFETY: `current` is written by `pthread_sigmask` (a NULL new set
        // only reads the mask) before it is returned.
        unsafe {
            let mut current: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut current);
            current
        }
    }

    fn is_member(set: &libc::sigset_t, signal: libc::c_int) -> bool {
        // SAFETY: `set` is an initialised signal set.
        unsafe { libc::sigismember(set, signal) == 1 }
    }

    #[test]
    fn the_new_thread_blocks_the_asynchronous_signals_and_the_caller_is_as_before() {
        let before = blocked_now();
        let inside = spawn(Builder::new().name("t".into()), blocked_now)
            .unwrap()
            .join()
            .unwrap();
        for signal in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGRTMIN(),
        ] {
            assert!(is_member(&inside, signal), "{signal}");
        }
        for signal in SYNCHRONOUS {
            assert!(!is_member(&inside, signal), "{signal}");
        }
        let after = blocked_now();
        for signal in 1..libc::SIGRTMAX() {
            assert_eq!(
                is_member(&before, signal),
                is_member(&after, signal),
                "{signal}"
            );
        }
    }
}
