//! The HTTP/1.1 server of `PrometheusEventHandler.serve()` (docs/sinks.md,
//! "Native histograms"): std::net and threads, no Python. One thread
//! accepts; each connection gets a thread of its own. It answers
//! `GET`/`HEAD` of `/metrics` and `/` with the body of the renderer it was
//! given (text or protobuf, by the `Accept` header, as
//! `prometheus::negotiate` reads it), `503` when that renderer has nothing
//! (the handler is closed), `404` for another path, `405` for another
//! method, `400` for a request it cannot read, `408` for one whose head is
//! not in by its deadline; every response closes the connection.
//!
//! Slow clients (docs/sinks.md, "Serving"; the bounds are `Limits`): a
//! request head must be complete within `head_deadline` (5 s) of the
//! accept, however the bytes trickle in: a deadline for the whole head, as
//! Go's `http.Server.ReadHeaderTimeout` that client_golang's servers rely
//! on, not a timeout per read, which one byte every few seconds renews for
//! ever. A response must be written within `response_deadline` (10 s).
//! When `max_connections` (64) connections have a thread and another
//! arrives, the one that has waited longest for its head is shut down to
//! make room: a scrape sends its head as it connects, so the connections
//! still waiting are the slow ones, and however many of them there are, a
//! new scrape gets a thread. Only when every thread is past its head (as
//! many renders or responses at once) is a newcomer answered `503`, on one
//! of `max_rejecting` (8) threads kept for that, after its head is read
//! (within `reject_deadline`, 1 s): a socket closed with the request unread
//! reaches the client as a reset, not as the `503`.
//!
//! Why no HTTP library: a scrape is one request line and one header, and
//! the whole server is the few lines below; a library would add a runtime
//! or a dependency tree to a package whose other sinks need none.

use super::negotiate::{Negotiated, negotiate};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The body of a scrape as negotiated, or `None` once the handler is closed.
pub type Render = dyn Fn(Negotiated) -> Option<Vec<u8>> + Send + Sync;

/// A request head larger than this is refused (a scrape's is a few hundred bytes).
pub const MAX_HEAD: usize = 16 * 1024;
/// How often the accepting thread looks at the stop flag while idle.
const POLL_MS: i32 = 100;

/// The server's bounds on slow clients; `Limits::default()` is what
/// `serve()` uses (docs/sinks.md, "Serving").
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections with a thread of their own at once, waiting for their
    /// head or being answered.
    pub max_connections: usize,
    /// From the accept to the end of the request head, in all.
    pub head_deadline: Duration,
    /// From the end of the head to the last byte of the response, in all.
    pub response_deadline: Duration,
    /// Threads that read a head only to answer it `503`, at once; more
    /// newcomers are closed unread.
    pub max_rejecting: usize,
    /// The head and the `503` of a connection answered so, each.
    pub reject_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // 64 threads of 256 KiB stacks (reserved, mostly untouched):
            // Prometheus scrapes a rank once per interval, so this many
            // heads at once are slow clients, whom eviction handles.
            max_connections: 64,
            // A scrape's head is one packet sent as it connects; 5 s
            // leaves room for a lossy link's retransmissions.
            head_deadline: Duration::from_secs(5),
            // Prometheus's default scrape_timeout: a scraper gives up then.
            response_deadline: Duration::from_secs(10),
            max_rejecting: 8,
            reject_deadline: Duration::from_secs(1),
        }
    }
}

/// What a tracked connection's thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Free,
    /// Reading its head: the oldest of these is shut down for a newcomer.
    Head,
    /// Rendering or writing its response.
    Answering,
    /// Reading a head to answer it `503`.
    Rejecting,
    /// Shut down for a newcomer; its thread has yet to see it and leave.
    Evicted,
}

struct Entry {
    phase: Phase,
    fd: i32,
    accepted: Instant,
}

/// The open connections, each with its thread.
struct Table {
    entries: Vec<Entry>,
}

impl Table {
    fn count(&self, phases: &[Phase]) -> usize {
        self.entries
            .iter()
            .filter(|entry| phases.contains(&entry.phase))
            .count()
    }

    fn free_index(&self) -> Option<usize> {
        self.entries
            .iter()
            .position(|entry| entry.phase == Phase::Free)
    }
}

struct Shared {
    stop: AtomicBool,
    limits: Limits,
    table: Mutex<Table>,
    /// The descriptors of `table`, readable without its lock: a forked
    /// child, which may have copied the lock held, closes them
    /// (`forget_in_child`). Set before a connection's thread starts,
    /// cleared before its socket is closed, so that a descriptor here is
    /// always open, and that connection's.
    fds: Box<[AtomicI32]>,
    /// Set by the accepting thread as it ends.
    ended: Mutex<bool>,
    ended_signal: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic on a server thread leaves the table consistent (each change
    // is one assignment), so a poisoned lock is used as is.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a whole request head has arrived on `fd`, unread: peeked at,
/// without waiting and without taking it from the socket.
fn head_is_waiting(fd: i32) -> bool {
    let mut buffer = [0u8; 4096];
    // SAFETY: `buffer` is valid for writes of its length for the duration
    // of the call; `fd` is open (see `Shared::admit`), and MSG_PEEK leaves
    // the bytes for the connection's thread.
    let peeked = unsafe {
        libc::recv(
            fd,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    peeked > 0
        && buffer[..peeked as usize]
            .windows(4)
            .any(|w| w == b"\r\n\r\n")
}

/// What the accepting thread does with a new connection.
enum Admission {
    /// Served on a thread of its own, in this entry of the table.
    Serve(usize),
    /// Its head read and answered `503` on a thread, in this entry.
    Reject(usize),
    /// Closed unread: even the rejecting threads are all busy.
    Drop,
}

impl Shared {
    fn admit(&self, fd: i32) -> Admission {
        let mut table = lock(&self.table);
        let limits = self.limits;
        let mut room = table.count(&[Phase::Head, Phase::Answering]) < limits.max_connections;
        if !room {
            // The connection that has waited longest for its head makes
            // room; its thread sees the shutdown as an end of stream. One
            // whose whole head has arrived, unread yet by a thread that
            // has not run (on a busy machine), is a scrape about to be
            // answered: it is passed over.
            let mut waiting: Vec<(Instant, usize)> = table
                .entries
                .iter()
                .enumerate()
                .filter(|(_, entry)| entry.phase == Phase::Head)
                .map(|(index, entry)| (entry.accepted, index))
                .collect();
            waiting.sort_unstable();
            let oldest = waiting
                .into_iter()
                .map(|(_, index)| index)
                .find(|&index| !head_is_waiting(table.entries[index].fd));
            if let Some(oldest) = oldest {
                let entry = &mut table.entries[oldest];
                // SAFETY: plain syscall on an integer. The descriptor is
                // open: its thread closes it only after clearing the entry,
                // under this lock, which we hold.
                unsafe {
                    libc::shutdown(entry.fd, libc::SHUT_RDWR);
                }
                entry.phase = Phase::Evicted;
                room = true;
            }
        }
        let phase = if room {
            Phase::Head
        } else if table.count(&[Phase::Rejecting]) < limits.max_rejecting {
            Phase::Rejecting
        } else {
            return Admission::Drop;
        };
        let Some(index) = table.free_index() else {
            return Admission::Drop; // evicted threads not gone yet; rare
        };
        table.entries[index] = Entry {
            phase,
            fd,
            accepted: Instant::now(),
        };
        self.fds[index].store(fd, Ordering::SeqCst);
        if phase == Phase::Head {
            Admission::Serve(index)
        } else {
            Admission::Reject(index)
        }
    }

    /// The head of entry `index` is in: true if it may be answered, false
    /// if it was evicted meanwhile.
    fn begin_answering(&self, index: usize) -> bool {
        let mut table = lock(&self.table);
        let entry = &mut table.entries[index];
        if entry.phase == Phase::Head {
            entry.phase = Phase::Answering;
            true
        } else {
            entry.phase == Phase::Rejecting
        }
    }

    /// Frees entry `index`; its thread closes the socket after this.
    fn release(&self, index: usize) {
        let mut table = lock(&self.table);
        self.fds[index].store(-1, Ordering::SeqCst);
        table.entries[index] = Entry {
            phase: Phase::Free,
            fd: -1,
            accepted: table.entries[index].accepted,
        };
    }

    /// At stop: the connections still waiting for a head are shut down
    /// (those being answered finish, so that no body is cut short).
    fn shut_down_waiting(&self) {
        let mut table = lock(&self.table);
        for entry in table.entries.iter_mut() {
            if matches!(entry.phase, Phase::Head | Phase::Rejecting) {
                // SAFETY: as in `admit`: open until its entry is released.
                unsafe {
                    libc::shutdown(entry.fd, libc::SHUT_RDWR);
                }
                entry.phase = Phase::Evicted;
            }
        }
    }
}

/// A running server. `stop` (or drop) ends it.
pub struct Server {
    port: u16,
    listener_fd: i32,
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    /// Binds `host:port` (port 0: a free one) here, so that a taken port is
    /// this call's error, and serves `render` on a new thread.
    pub fn start(host: &str, port: u16, render: Arc<Render>) -> io::Result<Server> {
        Server::start_with(host, port, render, Limits::default())
    }

    /// `start` with other limits (tests).
    pub fn start_with(
        host: &str,
        port: u16,
        render: Arc<Render>,
        limits: Limits,
    ) -> io::Result<Server> {
        let address = (host, port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
        let listener = TcpListener::bind(address)?;
        let port = listener.local_addr()?.port();
        let listener_fd = listener.as_raw_fd();
        // Evicted connections keep their entry until their thread leaves,
        // which on a busy machine can take a while: with the table twice
        // `max_connections`, 200 slow clients reconnecting at once filled
        // it with those and newcomers were closed unread (5 % of scrapes,
        // benches/bench_prometheus_slowloris.py); an entry is 32 bytes.
        let size = 8 * limits.max_connections + limits.max_rejecting;
        let now = Instant::now();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            limits,
            table: Mutex::new(Table {
                entries: (0..size)
                    .map(|_| Entry {
                        phase: Phase::Free,
                        fd: -1,
                        accepted: now,
                    })
                    .collect(),
            }),
            fds: (0..size).map(|_| AtomicI32::new(-1)).collect(),
            ended: Mutex::new(false),
            ended_signal: Condvar::new(),
        });
        let thread = {
            let shared = shared.clone();
            let builder = thread::Builder::new().name(format!("torchmon-prometheus-{port}"));
            // Its scrape threads inherit its mask (crate::threads).
            crate::threads::spawn(builder, move || {
                accept_loop(&listener, &shared, &render);
                drop(listener);
                shared.shut_down_waiting();
                *lock(&shared.ended) = true;
                shared.ended_signal.notify_all();
            })?
        };
        Ok(Server {
            port,
            listener_fd,
            shared,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting and frees the port: the accepting thread sees the
    /// flag within `POLL_MS`, shuts down the connections still waiting for
    /// a head, and is joined if it ends within `timeout` (connections being
    /// answered finish on their own threads, bounded by
    /// `response_deadline`). True if it was joined.
    pub fn stop(mut self, timeout: Duration) -> bool {
        self.stop_and_join(timeout)
    }

    fn stop_and_join(&mut self, timeout: Duration) -> bool {
        self.shared.stop.store(true, Ordering::SeqCst);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        let ended = lock(&self.shared.ended);
        let (ended, _) = self
            .shared
            .ended_signal
            .wait_timeout_while(ended, timeout, |ended| !*ended)
            .unwrap_or_else(|e| e.into_inner());
        if *ended {
            drop(ended);
            let _ = thread.join();
            true
        } else {
            false // left running; it ends at its next poll
        }
    }

    /// In a forked child, where the server's threads do not exist: closes
    /// the child's copies of the listening socket and of every connection
    /// socket (the parent keeps serving on them; a child left holding them
    /// would keep the port bound after the parent ended, and keep open a
    /// connection the parent closes, so that its client never sees the
    /// end), and forgets the rest without touching it: no lock, which a
    /// parent's thread may have held at the fork. A connection the parent
    /// accepted in the instant before the fork, not yet in the table, is
    /// not closed; the child keeps that copy until it exits.
    pub fn forget_in_child(self) {
        // SAFETY: the listener and the descriptors in `fds` were open in
        // the parent at the fork (a connection's is cleared before its
        // socket is closed), so they are open here, copies of this
        // server's sockets. Their owners, the server's threads, do not exist
        // in the child (fork copies only the calling thread) and `self` is
        // forgotten below, so nothing in this process uses or closes them
        // again. Closing a forked copy only drops the child's reference
        // to the socket: the parent's connection is untouched.
        unsafe {
            libc::close(self.listener_fd);
            for fd in self.shared.fds.iter() {
                let fd = fd.swap(-1, Ordering::SeqCst);
                if fd >= 0 {
                    libc::close(fd);
                }
            }
        }
        // Dropping would join or detach a thread id of the parent's.
        std::mem::forget(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_and_join(Duration::from_secs(2));
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, render: &Arc<Render>) {
    let mut poll = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while !shared.stop.load(Ordering::SeqCst) {
        poll.revents = 0;
        // SAFETY: `poll` points to one valid pollfd for the duration of the
        // call, and the count passed is 1.
        let ready = unsafe { libc::poll(&mut poll, 1, POLL_MS) };
        if ready <= 0 {
            continue; // timeout, or EINTR
        }
        let Ok((stream, _)) = listener.accept() else {
            continue;
        };
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (index, rejecting) = match shared.admit(stream.as_raw_fd()) {
            Admission::Serve(index) => (index, false),
            Admission::Reject(index) => (index, true),
            Admission::Drop => {
                // Shut down, not only closed, as every connection it ends.
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            }
        };
        // The thread takes the descriptor, not the stream: if it cannot
        // start, the socket is closed here, after its entry is freed.
        let fd = stream.into_raw_fd();
        let (connection_shared, render) = (shared.clone(), render.clone());
        let spawned = thread::Builder::new()
            .name("torchmon-prometheus-scrape".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                // SAFETY: `fd` is the accepted socket, owned by this thread
                // alone from here on.
                let stream = unsafe { TcpStream::from_raw_fd(fd) };
                if rejecting {
                    reject_connection(&stream, &connection_shared, index);
                } else {
                    serve_connection(&stream, &connection_shared, index, &render);
                }
                connection_shared.release(index);
                drop(stream); // closed only once its entry is free
            });
        if spawned.is_err() {
            shared.release(index);
            // SAFETY: the closure that would have owned `fd` never ran and
            // was dropped without closing it (it holds a plain integer), so
            // `fd` is open and ours; shut down as every connection ended.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
                libc::close(fd);
            }
        }
    }
}

/// Lowers the calling thread to the lowest CPU priority (nice 19), so that a
/// render competing for a core with the training loop yields it: on a
/// loaded machine the loop's longest gap otherwise grows by a scheduler
/// time slice per scrape (docs/performance.md, "Prometheus scrapes").
fn yield_the_cpu_to_the_training_loop() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers and
        // touch no memory of ours; on Linux a thread id names that thread
        // alone. A failure leaves the priority as it was, which is harmless.
        unsafe {
            let thread_id = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, thread_id as libc::id_t, 19);
        }
    }
}

/// How a request head ended.
enum Head {
    Complete(Vec<u8>),
    /// The deadline passed with part of it, or none if the `Vec` is empty.
    TimedOut(Vec<u8>),
    /// Too large, or the client closed (or was shut down) before its end.
    Broken(Vec<u8>),
}

/// Reads a request head until `deadline`, however the bytes trickle in:
/// each read may wait only for what is left of it.
fn read_head(mut stream: &TcpStream, deadline: Instant) -> Head {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Head::TimedOut(head);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Head::Broken(head),
            Ok(n) => {
                head.extend_from_slice(&chunk[..n]);
                if head.windows(4).any(|w| w == b"\r\n\r\n") {
                    return Head::Complete(head);
                }
                if head.len() > MAX_HEAD {
                    return Head::Broken(head);
                }
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Head::TimedOut(head);
            }
            Err(_) => return Head::Broken(head),
        }
    }
}

/// Reads one request head and answers it, entry `index` of the table.
fn serve_connection(stream: &TcpStream, shared: &Shared, index: usize, render: &Arc<Render>) {
    let limits = shared.limits;
    // At the normal priority until the head is in: reading it costs next
    // to nothing, and a thread at nice 19 that waits behind busy
    // processes (slow clients reconnecting, say) would stay a candidate
    // for eviction all that while.
    let head = read_head(stream, Instant::now() + limits.head_deadline);
    yield_the_cpu_to_the_training_loop();
    // Past its head, it is no longer a candidate for eviction; if it was
    // evicted meanwhile, its socket is shut down and there is no one to
    // answer.
    if !shared.begin_answering(index) {
        return;
    }
    let response = match head {
        Head::Complete(head) => answer(&head, render),
        Head::TimedOut(head) | Head::Broken(head) if head.is_empty() => {
            // Connected and left, or stayed silent. Shut down, not only
            // closed: the client sees the end even if another process
            // holds a copy of the socket (one forked in the instant
            // before this connection was in the table).
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        Head::TimedOut(_) => Response::plain("408 Request Timeout", "request head too slow\n"),
        Head::Broken(_) => Response::plain("400 Bad Request", "bad request\n"),
    };
    respond(stream, &response, Instant::now() + limits.response_deadline);
}

/// Answers `503` to a connection that came when every thread was busy
/// answering: after reading its head (a client whose request is unread
/// when the socket closes gets a reset instead of the response).
fn reject_connection(stream: &TcpStream, shared: &Shared, index: usize) {
    let limits = shared.limits;
    let head = read_head(stream, Instant::now() + limits.reject_deadline);
    if !shared.begin_answering(index) {
        return; // shut down by a stop
    }
    if let Head::TimedOut(head) | Head::Broken(head) = &head
        && head.is_empty()
    {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let busy = Response::plain("503 Service Unavailable", "busy\n");
    respond(stream, &busy, Instant::now() + limits.reject_deadline);
}

struct Response {
    status: &'static str,
    content_type: String,
    body: Vec<u8>,
    head_only: bool,
}

impl Response {
    fn plain(status: &'static str, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8".to_owned(),
            body: body.as_bytes().to_vec(),
            head_only: false,
        }
    }
}

/// The response to a complete request head.
fn answer(head: &[u8], render: &Arc<Render>) -> Response {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut words = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Response::plain("400 Bad Request", "bad request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return Response::plain("400 Bad Request", "bad request line\n");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Response::plain("405 Method Not Allowed", "GET or HEAD\n"),
    };
    let path = target.split(['?', '#']).next().unwrap_or("");
    if path != "/metrics" && path != "/" {
        return Response::plain("404 Not Found", "torchmon serves /metrics\n");
    }
    let accept = lines
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, value)| value.trim())
        .collect::<Vec<_>>()
        .join(",");
    let negotiated = negotiate(&accept);
    match render(negotiated) {
        Some(body) => Response {
            status: "200 OK",
            content_type: negotiated.content_type(),
            body,
            head_only,
        },
        None => Response::plain(
            "503 Service Unavailable",
            "torchmon: this PrometheusEventHandler is closed\n",
        ),
    }
}

/// Writes `response` and closes the sending side, giving up at `deadline`
/// however slowly the client reads.
fn respond(stream: &TcpStream, response: &Response, deadline: Instant) {
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    );
    if write_by(stream, head.as_bytes(), deadline) && !response.head_only {
        write_by(stream, &response.body, deadline);
    }
    let _ = stream.shutdown(Shutdown::Write);
}

/// Writes all of `bytes` before `deadline`; false if it could not.
fn write_by(mut stream: &TcpStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus::negotiate::{PROTOBUF_CONTENT_TYPE, TEXT_CONTENT_TYPE};

    fn get(port: u16, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    #[test]
    fn serves_paths_formats_and_stops() {
        let closed = Arc::new(AtomicBool::new(false));
        let render: Arc<Render> = {
            let closed = closed.clone();
            Arc::new(move |negotiated: Negotiated| {
                (!closed.load(Ordering::SeqCst))
                    .then(|| format!("{:?}", negotiated.format).into_bytes())
            })
        };
        let server = Server::start("127.0.0.1", 0, render).unwrap();
        let port = server.port();
        // A silent client holds only its own thread.
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let text = get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nText"), "{text}");
        let protobuf = get(
            port,
            b"GET / HTTP/1.1\r\naccept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited\r\n\r\n",
        );
        assert!(protobuf.ends_with("\r\n\r\nProtobuf"), "{protobuf}");
        assert!(protobuf.contains(&format!("\r\nContent-Type: {PROTOBUF_CONTENT_TYPE}\r\n")));
        // The scheme the scraper named, stated by the Content-Type.
        let utf8 = get(
            port,
            b"GET / HTTP/1.1\r\naccept: text/plain;version=0.0.4;escaping=allow-utf-8\r\n\r\n",
        );
        assert!(
            utf8.contains(&format!(
                "\r\nContent-Type: {TEXT_CONTENT_TYPE}; escaping=allow-utf-8\r\n"
            )),
            "{utf8}"
        );
        assert!(get(port, b"GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(port, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(get(port, b"garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        let head = get(port, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.contains("Content-Length: 4\r\n") && head.ends_with("\r\n\r\n"));
        closed.store(true, Ordering::SeqCst);
        assert!(get(port, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503"));
        assert!(server.stop(Duration::from_secs(5)));
        // The port is free again.
        TcpListener::bind(("127.0.0.1", port)).unwrap();
    }

    fn quick_limits() -> Limits {
        Limits {
            max_connections: 4,
            head_deadline: Duration::from_millis(1500),
            response_deadline: Duration::from_secs(5),
            max_rejecting: 2,
            reject_deadline: Duration::from_millis(500),
        }
    }

    fn text_render() -> Arc<Render> {
        Arc::new(|negotiated: Negotiated| Some(format!("{:?}", negotiated.format).into_bytes()))
    }

    /// Reads until the server closes; what it sent, and how long that took.
    fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
        let start = Instant::now();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        (
            String::from_utf8_lossy(&response).into_owned(),
            start.elapsed(),
        )
    }

    #[test]
    fn a_trickling_head_is_cut_off_at_the_head_deadline() {
        let server = Server::start_with("127.0.0.1", 0, text_render(), quick_limits()).unwrap();
        let mut slow = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        let writer = {
            let mut slow = slow.try_clone().unwrap();
            thread::spawn(move || {
                // A byte every 200 ms: each read is quick, the head never ends.
                for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaa".iter() {
                    if slow.write_all(&[*byte]).is_err() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let (response, took) = read_until_closed(&mut slow);
        assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        assert!(took < Duration::from_millis(2500), "{took:?}");
        writer.join().unwrap();
        assert!(server.stop(Duration::from_secs(5)));
    }

    #[test]
    fn a_newcomer_evicts_the_oldest_connection_waiting_for_its_head() {
        let server = Server::start_with("127.0.0.1", 0, text_render(), quick_limits()).unwrap();
        let port = server.port();
        // Twice the connections the server has threads for, all silent.
        let mut silent: Vec<TcpStream> = (0..8)
            .map(|_| {
                let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                thread::sleep(Duration::from_millis(20)); // accepted in this order
                stream
            })
            .collect();
        for _ in 0..5 {
            let response = get(port, b"GET /metrics HTTP/1.1\r\n\r\n");
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        }
        // The oldest were shut down to make room, at once, not at their deadline.
        let (response, took) = read_until_closed(&mut silent[0]);
        assert_eq!(response, "");
        assert!(took < Duration::from_millis(1000), "{took:?}");
        assert!(server.stop(Duration::from_secs(5)));
    }

    #[test]
    fn with_every_thread_answering_a_newcomer_reads_a_503_not_a_reset() {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(released);
        let render: Arc<Render> = Arc::new(move |_| {
            let _ = lock(&released).recv_timeout(Duration::from_secs(10));
            Some(b"late".to_vec())
        });
        let server = Server::start_with("127.0.0.1", 0, render, quick_limits()).unwrap();
        let port = server.port();
        // Four scrapes whose renders wait: every thread is answering.
        let busy: Vec<_> = (0..4)
            .map(|_| thread::spawn(move || get(port, b"GET /metrics HTTP/1.1\r\n\r\n")))
            .collect();
        thread::sleep(Duration::from_millis(300));
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The head comes a little after the connection: it is read first.
        thread::sleep(Duration::from_millis(100));
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (response, _) = read_until_closed(&mut stream);
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        for _ in 0..4 {
            release.send(()).unwrap();
        }
        for scrape in busy {
            assert!(scrape.join().unwrap().ends_with("\r\n\r\nlate"));
        }
        assert!(server.stop(Duration::from_secs(5)));
    }

    #[test]
    fn stop_shuts_down_the_connections_waiting_for_a_head() {
        let server = Server::start_with("127.0.0.1", 0, text_render(), Limits::default()).unwrap();
        let mut silent = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        thread::sleep(Duration::from_millis(200)); // accepted
        assert!(server.stop(Duration::from_secs(5)));
        let (response, took) = read_until_closed(&mut silent);
        assert_eq!(response, "");
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
}
