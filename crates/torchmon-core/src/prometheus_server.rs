//! The HTTP/1.1 server of `PrometheusEventHandler.serve()` (docs/sinks.md,
//! "Native histograms"): std::net and threads, no Python. One thread
//! accepts; each connection gets a thread of its own with read and write
//! timeouts, so a slow or garbage client holds only its own thread. It
//! answers `GET`/`HEAD` of `/metrics` and `/` with the body of the renderer
//! it was given (text or protobuf, by the `Accept` header), `503` when that
//! renderer has nothing (the handler is closed), `404` for another path,
//! `405` for another method, `400` for a request it cannot read; every
//! response closes the connection.
//!
//! Why no HTTP library: a scrape is one request line and one header, and
//! the whole server is the few lines below; a library would add a runtime
//! or a dependency tree to a package whose other sinks need none.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// What a scraper asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Protobuf,
}

pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// The body of a scrape in `Format`, or `None` once the handler is closed.
pub type Render = dyn Fn(Format) -> Option<Vec<u8>> + Send + Sync;

/// A request head larger than this is refused (a scrape's is a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request or read the response.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are answered 503 at once.
const MAX_CONNECTIONS: usize = 32;
/// How often the accepting thread looks at the stop flag while idle.
const POLL_MS: i32 = 100;

/// Whether an `Accept` header prefers the delimited MetricFamily protobuf:
/// its quality is above 0 and at least that of every text format it names.
/// A header naming no known format gets text. The rule of
/// python/torchmon/handlers/prometheus.py's `_accepts_protobuf`.
pub fn accepts_protobuf(accept: &str) -> bool {
    let (mut protobuf, mut text) = (0.0f64, 0.0f64);
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut quality, mut proto, mut encoding) = (1.0f64, None, None);
        for param in parts {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => quality = value.parse().unwrap_or(0.0),
                "proto" => proto = Some(value),
                "encoding" => encoding = Some(value),
                _ => {}
            }
        }
        if quality.is_nan() {
            quality = 0.0;
        }
        match media_type.as_str() {
            "application/vnd.google.protobuf"
                if proto == Some("io.prometheus.client.MetricFamily")
                    && encoding == Some("delimited") =>
            {
                protobuf = protobuf.max(quality);
            }
            "text/plain" | "application/openmetrics-text" | "*/*" | "text/*" => {
                text = text.max(quality)
            }
            _ => {}
        }
    }
    protobuf > 0.0 && protobuf >= text
}

struct Shared {
    stop: AtomicBool,
    connections: AtomicUsize,
    /// Set by the accepting thread as it ends.
    ended: Mutex<bool>,
    ended_signal: Condvar,
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
        let address = (host, port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
        let listener = TcpListener::bind(address)?;
        let port = listener.local_addr()?.port();
        let listener_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            ended: Mutex::new(false),
            ended_signal: Condvar::new(),
        });
        let thread = {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("torchmon-prometheus-{port}"))
                .spawn(move || {
                    accept_loop(&listener, &shared, &render);
                    drop(listener);
                    *shared.ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
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
    /// flag within `POLL_MS` and is joined if it ends within `timeout`
    /// (connections in progress finish on their own threads, bounded by
    /// their timeouts). True if it was joined.
    pub fn stop(mut self, timeout: Duration) -> bool {
        self.stop_and_join(timeout)
    }

    fn stop_and_join(&mut self, timeout: Duration) -> bool {
        self.shared.stop.store(true, Ordering::SeqCst);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        let ended = self.shared.ended.lock().unwrap_or_else(|e| e.into_inner());
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

    /// In a forked child, where the accepting thread does not exist: closes
    /// the child's copy of the listening socket (the parent's keeps
    /// serving; a child left holding it would keep the port bound after the
    /// parent ended) and forgets the rest without touching it.
    pub fn forget_in_child(self) {
        // SAFETY: the descriptor is this server's listener, inherited by the
        // fork; its owner, the accepting thread, does not exist in the child
        // (fork copies only the calling thread) and `self` is forgotten
        // below, so nothing in this process uses or closes it again. Closing
        // a forked copy only drops the child's reference to the socket.
        unsafe {
            libc::close(self.listener_fd);
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
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            respond(
                &stream,
                "503 Service Unavailable",
                "text/plain",
                b"busy\n",
                false,
            );
            continue;
        }
        let (connection_shared, render) = (shared.clone(), render.clone());
        let spawned = thread::Builder::new()
            .name("torchmon-prometheus-scrape".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                serve_connection(stream, &render);
                connection_shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // The closure never runs (the stream in it is dropped: the
            // client sees the connection closed), so its count is undone here.
            shared.connections.fetch_sub(1, Ordering::SeqCst);
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

/// Reads one request head and answers it.
fn serve_connection(mut stream: TcpStream, render: &Arc<Render>) {
    yield_the_cpu_to_the_training_loop();
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let complete = loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break false,
            Ok(n) => {
                head.extend_from_slice(&chunk[..n]);
                if head.windows(4).any(|w| w == b"\r\n\r\n") {
                    break true;
                }
                if head.len() > MAX_HEAD {
                    break false;
                }
            }
        }
    };
    let response = if complete {
        answer(&head, render)
    } else if head.is_empty() {
        return; // connected and left, or timed out silent
    } else {
        Response::plain("400 Bad Request", "bad request\n")
    };
    respond(
        &stream,
        response.status,
        response.content_type,
        &response.body,
        !response.head_only,
    );
    let _ = stream.shutdown(Shutdown::Write);
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
    head_only: bool,
}

impl Response {
    fn plain(status: &'static str, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
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
    let format = if accepts_protobuf(&accept) {
        Format::Protobuf
    } else {
        Format::Text
    };
    match render(format) {
        Some(body) => Response {
            status: "200 OK",
            content_type: match format {
                Format::Text => TEXT_CONTENT_TYPE,
                Format::Protobuf => PROTOBUF_CONTENT_TYPE,
            },
            body,
            head_only,
        },
        None => Response::plain(
            "503 Service Unavailable",
            "torchmon: this PrometheusEventHandler is closed\n",
        ),
    }
}

fn respond(mut stream: &TcpStream, status: &str, content_type: &str, body: &[u8], with_body: bool) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).is_ok() && with_body {
        let _ = stream.write_all(body);
    }
    let _ = stream.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        let prometheus = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(accepts_protobuf(prometheus));
        assert!(!accepts_protobuf(""));
        assert!(!accepts_protobuf("text/plain"));
        assert!(!accepts_protobuf("application/json, image/png"));
        assert!(!accepts_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"
        ));
        assert!(!accepts_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,text/plain;q=0.5"
        ));
    }

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
            Arc::new(move |format| {
                (!closed.load(Ordering::SeqCst)).then(|| format!("{format:?}").into_bytes())
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
}
