//! A TensorBoard event file written by a background thread: the record
//! framing (`record`), the `Event`/`Summary`/`HistogramProto` messages
//! (`proto`) and `EventFileWriter`, which names the file as TensorBoard's
//! loader expects, writes its `file_version` event at once and then each
//! `SummaryEvent` handed to it, on its own worker thread (`worker`), one
//! whole record per write (docs/sinks.md, "TensorBoard").
//!
//! The calling thread only builds the `SummaryEvent` and queues it; the
//! encoding, the histogram buckets and the file I/O happen on the worker.
//! A forked child writes nothing: the writer belongs to the process that
//! made it (docs/internals.md, "Fork").

mod proto;
mod record;

pub use proto::{FILE_VERSION, SummaryEvent, histogram_buckets, histogram_range};
pub use record::{append_record, crc32c, masked_crc32c};

use crate::worker::{Flow, Pushed, Sink, Worker};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Windows queued and not yet written, at most: past it the calling thread
/// waits for the worker (a disk slower than the windows), as a synchronous
/// sink would.
pub const CAPACITY: usize = 1 << 14;

/// Files made by this process so far: the last part of each file name, so
/// that two writers made in one second never share a file.
static FILES_MADE: AtomicU64 = AtomicU64::new(0);

/// What became of an event handed to `EventFileWriter::write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Queued,
    /// The writer was closed.
    Closed,
    /// Called in a forked child of the process that made the writer.
    OtherProcess,
    /// The queue stayed full for the whole patience.
    Full,
}

/// Why `EventFileWriter::create` failed, and on which path.
#[derive(Debug)]
pub struct CreateError {
    pub error: io::Error,
    pub path: PathBuf,
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

pub struct EventFileWriter {
    /// Scalars accepted so far, and the NaN or infinite ones among them
    /// (`torchmon to-tensorboard` reports both).
    scalars: AtomicU64,
    non_finite: AtomicU64,
    /// Not dropped in a forked child: the parent's thread, which the child
    /// does not have, may have held the channel's locks at the fork.
    worker: ManuallyDrop<Worker<SummaryEvent>>,
    path: PathBuf,
    pid: u32,
}

impl EventFileWriter {
    /// Creates `logdir` (and its parents) if needed, and in it the file
    /// `events.out.tfevents.<secs>.<host>.<pid>.<n><filename_suffix>`
    /// holding its `file_version` event; then starts the worker thread.
    /// An error comes with the path that could not be made or written.
    pub fn create(logdir: &Path, filename_suffix: &str) -> Result<Self, CreateError> {
        let named = |error: io::Error, path: &Path| CreateError {
            error,
            path: path.to_path_buf(),
        };
        std::fs::create_dir_all(logdir).map_err(|e| named(e, logdir))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let pid = std::process::id();
        let n = FILES_MADE.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "events.out.tfevents.{:010}.{}.{pid}.{n}{filename_suffix}",
            now.as_secs(),
            hostname()
        );
        let path = logdir.join(name);
        let mut file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| named(e, &path))?;
        let mut first = Vec::new();
        let mut data = Vec::new();
        proto::encode_file_version(now.as_secs_f64(), &mut data);
        record::append_record(&mut first, &data);
        file.write_all(&first).map_err(|e| named(e, &path))?;
        let sink = FileSink {
            file,
            length: first.len() as u64,
            path: path.clone(),
            failing: false,
            data: Vec::new(),
            record: Vec::new(),
            scratch: proto::Scratch::default(),
        };
        let worker =
            Worker::spawn(CAPACITY, sink, "torchmon-tensorboard").map_err(|e| named(e, &path))?;
        Ok(EventFileWriter {
            scalars: AtomicU64::new(0),
            non_finite: AtomicU64::new(0),
            worker: ManuallyDrop::new(worker),
            path,
            pid,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn in_owner(&self) -> bool {
        std::process::id() == self.pid
    }

    /// Queues `event` without waiting, unless the queue is full: `Full`
    /// hands it back for `write_within`.
    pub fn try_write(&self, event: SummaryEvent) -> Result<Written, SummaryEvent> {
        if !self.in_owner() {
            return Ok(Written::OtherProcess);
        }
        let bad = event.scalars.iter().filter(|(_, v)| !v.is_finite()).count();
        self.scalars
            .fetch_add(event.scalars.len() as u64, Ordering::Relaxed);
        if bad > 0 {
            self.non_finite.fetch_add(bad as u64, Ordering::Relaxed);
        }
        match self.worker.try_push(event) {
            Pushed::Queued => Ok(Written::Queued),
            Pushed::Closed(_) => Ok(Written::Closed),
            Pushed::Full(event) => Err(event),
        }
    }

    /// Queues `event`, waiting up to `patience` for room.
    pub fn write_within(&self, event: SummaryEvent, patience: Duration) -> Written {
        if !self.in_owner() {
            return Written::OtherProcess;
        }
        match self.worker.push_within(event, patience) {
            Pushed::Queued => Written::Queued,
            Pushed::Closed(_) => Written::Closed,
            Pushed::Full(_) => {
                self.worker.add_dropped(1);
                Written::Full
            }
        }
    }

    /// Waits until every event queued before the call is in the file (or
    /// dropped by a failed write); `false` when `deadline` came first. In a
    /// forked child there is nothing of its own to wait for.
    pub fn flush(&self, deadline: Instant) -> bool {
        if !self.in_owner() {
            return true;
        }
        self.worker.start_flush().wait(deadline).is_some()
    }

    /// Writes what is queued (waiting up to `patience`), then stops the
    /// thread; later events come back `Closed`.
    pub fn close(&self, patience: Duration) -> bool {
        if !self.in_owner() {
            return true;
        }
        self.worker.begin_close();
        self.worker.finish_close(patience)
    }

    /// (scalars, NaN or infinite ones among them) handed to `try_write`
    /// in this process, queued or not.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.scalars.load(Ordering::Relaxed),
            self.non_finite.load(Ordering::Relaxed),
        )
    }

    pub fn is_closed(&self) -> bool {
        self.worker.is_closed()
    }
}

impl Drop for EventFileWriter {
    fn drop(&mut self) {
        if self.in_owner() {
            self.close(Duration::from_secs(10));
            // SAFETY: `worker` is not used after this line: `drop` runs
            // once, and this is the last use of `self.worker`.
            unsafe { ManuallyDrop::drop(&mut self.worker) };
        }
    }
}

/// The worker's side: encodes each event as one record, and appends a
/// batch of them with one write.
struct FileSink {
    file: File,
    /// The file's length after the last whole record: a failed write is
    /// cut back to it.
    length: u64,
    path: PathBuf,
    /// The last write failed (reported once until one succeeds again).
    failing: bool,
    data: Vec<u8>,
    /// The records of the batch, not written yet.
    record: Vec<u8>,
    scratch: proto::Scratch,
}

/// Past this many encoded bytes a batch is written before the next window
/// is encoded: the buffer stays small when windows arrive faster than the
/// disk takes them.
const BATCH_BYTES: usize = 1 << 20;

impl FileSink {
    /// Encodes `event` as one record at the end of `self.record`.
    fn encode(&mut self, event: &SummaryEvent) {
        self.data.clear();
        event.encode(&mut self.data, &mut self.scratch);
        record::append_record(&mut self.record, &self.data);
    }

    /// Appends the records encoded so far with one write: all of them, or
    /// (on an error) none, the part already written cut off again so that a
    /// reader never meets a torn record before later ones.
    fn write_out(&mut self) {
        if self.record.is_empty() {
            return;
        }
        match self.file.write_all(&self.record) {
            Ok(()) => {
                self.length += self.record.len() as u64;
                self.failing = false;
            }
            Err(error) => {
                let _ = self.file.set_len(self.length);
                if !self.failing {
                    self.failing = true;
                    eprintln!(
                        "torchmon: TensorboardEventHandler could not write to {}: {error}; \
                         windows are dropped until a write succeeds",
                        self.path.display()
                    );
                }
            }
        }
        self.record.clear();
    }
}

impl Sink<SummaryEvent> for FileSink {
    fn handle(&mut self, items: &mut dyn Iterator<Item = SummaryEvent>) -> Flow {
        // The windows that piled up go out in one write. A flush marker ends
        // the batch and is answered after this returns (worker.rs, `Batch`),
        // so everything before it is in the file by then.
        for event in items {
            self.encode(&event);
            if self.record.len() >= BATCH_BYTES {
                self.write_out();
            }
        }
        self.write_out();
        Flow::Continue
    }
}

/// The host name, as TensorBoard's writers put it in the file name;
/// `localhost` when it cannot be read.
#[cfg(not(unix))]
fn hostname() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "localhost".to_owned())
}

/// The host name, as TensorBoard's writers put it in the file name;
/// `localhost` when it cannot be read.
#[cfg(unix)]
fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: `buffer` is valid for writes of `buffer.len()` bytes, the
    // length passed; gethostname writes at most that many.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return "localhost".to_owned();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    let name = String::from_utf8_lossy(&buffer[..end]).into_owned();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The records of an event file: each one's data, after checking both
    /// CRCs; stops at a record cut short, as TensorBoard's reader does.
    fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut records = Vec::new();
        let mut at = 0;
        while at + 12 <= bytes.len() {
            let length = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(&bytes[at..at + 8]));
            let end = at + 12 + length + 4;
            if end > bytes.len() {
                break;
            }
            let data = &bytes[at + 12..at + 12 + length];
            let crc = u32::from_le_bytes(bytes[end - 4..end].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            records.push(data.to_vec());
            at = end;
        }
        records
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "torchmon-tb-{name}-{}-{:?}",
            std::process::id(),
            SystemTime::now()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn writes_a_named_file_of_whole_records() {
        let dir = temp_dir("records");
        let writer = EventFileWriter::create(&dir, ".test").unwrap();
        let name = writer
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        assert!(
            name.contains(&format!(".{}.", std::process::id())),
            "{name}"
        );
        assert!(name.ends_with(".test"), "{name}");
        for step in 1..=100 {
            let event = SummaryEvent {
                wall_time: 1.0 + step as f64,
                step,
                scalars: vec![("loss.mean".to_owned(), step as f64 / 2.0)],
                histograms: vec![],
            };
            assert_eq!(writer.try_write(event).unwrap(), Written::Queued);
        }
        assert!(writer.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(writer.counts(), (100, 0));
        let records = read_records(&std::fs::read(writer.path()).unwrap());
        assert_eq!(records.len(), 101);
        assert!(
            records[0]
                .windows(FILE_VERSION.len())
                .any(|w| w == FILE_VERSION.as_bytes())
        );
        assert!(writer.close(Duration::from_secs(10)));
        let event = SummaryEvent {
            histograms: vec![(
                "h".to_owned(),
                Arc::new(crate::histogram::Distribution {
                    count: 0,
                    sum: 0.0,
                    min: 0.0,
                    max: 0.0,
                    buckets: Default::default(),
                }),
            )],
            ..SummaryEvent::default()
        };
        assert_eq!(writer.try_write(event).unwrap(), Written::Closed);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named() {
        let file = temp_dir("notadir");
        std::fs::write(&file, b"x").unwrap();
        let error = EventFileWriter::create(&file.join("sub"), "")
            .err()
            .unwrap();
        assert!(
            error.to_string().contains(&file.display().to_string()),
            "{error}"
        );
        std::fs::remove_file(&file).unwrap();
    }
}
