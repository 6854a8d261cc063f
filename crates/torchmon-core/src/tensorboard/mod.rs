//! A TensorBoard event file written by a background thread: the record
//! framing (`record`), the `Event`/`Summary`/`HistogramProto` messages
//! (`proto`) and `EventFileWriter`, which names the file as TensorBoard's
//! loader expects, writes its `file_version` event at once and then each
//! `SummaryEvent` handed to it, on its own worker thread (`worker`), one
//! whole record per write (docs/sinks.md, "TensorBoard").
//!
//! The calling thread only builds the `SummaryEvent` and queues it; the
//! encoding, the histogram buckets and the file I/O happen on the worker.
//! The worker also notices, within a second, a file or directory removed
//! under it (an `rm -rf` of the log directory, a log rotation), which
//! Linux would let it go on writing into unseen, and starts a new file.
//! A forked child writes nothing: the writer belongs to the process that
//! made it (docs/internals.md, "Fork").

pub mod convert;
mod proto;
mod record;

pub use proto::{FILE_VERSION, SummaryEvent, histogram_buckets, histogram_range};
pub use record::{append_record, crc32c, masked_crc32c};

use crate::worker::{Flow, Pushed, Sink, Worker};
use parking_lot::Mutex;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Windows queued and not yet written, at most: past it the calling thread
/// waits for the worker (a disk slower than the windows), as a synchronous
/// sink would.
pub const CAPACITY: usize = 1 << 14;

/// Files made by this process so far: the last part of each file name, so
/// that two writers made in one second never share a file.
static FILES_MADE: AtomicU64 = AtomicU64::new(0);

/// How often, at most, the worker checks that its file is still at its
/// path: one `stat` a second on the worker thread, none on the thread that
/// closes a window (docs/performance.md, "TensorBoard").
const PATH_CHECK: Duration = Duration::from_secs(1);

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
    /// The file written, shared with the worker, which replaces it when the
    /// file is removed.
    path: Arc<Mutex<PathBuf>>,
    pid: u32,
}

/// An event file just made, its `file_version` record written.
struct NewFile {
    file: File,
    path: PathBuf,
    length: u64,
    identity: Identity,
}

/// Makes `logdir` (and its parents) if needed, and in it a new event file
/// with its `file_version` event. The file is created with `create_new`
/// (`O_EXCL`) and, on Unix, `O_NOFOLLOW`: a name planted in a shared
/// directory, a symlink included, is an error, never a file opened through
/// it (docs/sinks.md, "TensorBoard").
fn new_file(logdir: &Path, filename_suffix: &str) -> Result<NewFile, CreateError> {
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
    let mut options = OpenOptions::new();
    options.append(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let mut file = options.open(&path).map_err(|e| named(e, &path))?;
    let mut first = Vec::new();
    let mut data = Vec::new();
    proto::encode_file_version(now.as_secs_f64(), &mut data);
    record::append_record(&mut first, &data);
    let identity = file
        .write_all(&first)
        .and_then(|()| file.metadata())
        .map(|m| Identity::of(&m))
        .map_err(|e| {
            // Not left behind empty: a writer whose directory was removed
            // tries again every second, on a disk that may be full.
            let _ = std::fs::remove_file(&path);
            named(e, &path)
        })?;
    Ok(NewFile {
        file,
        path,
        length: first.len() as u64,
        identity,
    })
}

/// What tells the open file from another one at the same path: device and
/// inode on Unix; elsewhere nothing, and only a missing path is noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity(Option<(u64, u64)>);

impl Identity {
    #[cfg(unix)]
    fn of(metadata: &Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Identity(Some((metadata.dev(), metadata.ino())))
    }

    #[cfg(not(unix))]
    fn of(_metadata: &Metadata) -> Self {
        Identity(None)
    }
}

impl EventFileWriter {
    /// Creates `logdir` (and its parents) if needed, and in it the file
    /// `events.out.tfevents.<secs>.<host>.<pid>.<n><filename_suffix>`
    /// holding its `file_version` event; then starts the worker thread.
    /// An error comes with the path that could not be made or written.
    pub fn create(logdir: &Path, filename_suffix: &str) -> Result<Self, CreateError> {
        let made = new_file(logdir, filename_suffix)?;
        let pid = std::process::id();
        let path = Arc::new(Mutex::new(made.path.clone()));
        let sink = FileSink {
            file: made.file,
            length: made.length,
            identity: made.identity,
            path: made.path.clone(),
            shared_path: Arc::clone(&path),
            logdir: logdir.to_path_buf(),
            filename_suffix: filename_suffix.to_owned(),
            checked: Instant::now(),
            failing: false,
            lost: 0,
            batch: 0,
            data: Vec::new(),
            record: Vec::new(),
        };
        let worker =
            Worker::spawn(CAPACITY, sink, "torchmon-tensorboard").map_err(|error| CreateError {
                error,
                path: made.path.clone(),
            })?;
        Ok(EventFileWriter {
            scalars: AtomicU64::new(0),
            non_finite: AtomicU64::new(0),
            worker: ManuallyDrop::new(worker),
            path,
            pid,
        })
    }

    /// The file written now: a new one once the first was removed.
    pub fn path(&self) -> PathBuf {
        self.path.lock().clone()
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
    /// The open file's, to tell whether `path` still names it.
    identity: Identity,
    path: PathBuf,
    /// `path`, as `EventFileWriter::path` reads it.
    shared_path: Arc<Mutex<PathBuf>>,
    logdir: PathBuf,
    filename_suffix: String,
    /// When `path` was last compared with the open file.
    checked: Instant,
    /// The last write failed, or the file was removed and no new one could
    /// be made: reported once, and again when writing works again.
    failing: bool,
    /// Windows dropped since `failing` was set.
    lost: u64,
    /// Windows in `record`.
    batch: u64,
    data: Vec<u8>,
    /// The records of the batch, not written yet.
    record: Vec<u8>,
}

/// Past this many encoded bytes a batch is written before the next window
/// is encoded: the buffer stays small when windows arrive faster than the
/// disk takes them.
const BATCH_BYTES: usize = 1 << 20;

impl FileSink {
    /// Encodes `event` as one record at the end of `self.record`.
    fn encode(&mut self, event: &SummaryEvent) {
        self.data.clear();
        event.encode(&mut self.data);
        record::append_record(&mut self.record, &self.data);
        self.batch += 1;
    }

    /// Whether `path` still names the open file. Linux lets a process write
    /// on into a file removed under it, so a removed log directory would
    /// lose every later window without an error.
    fn still_at_path(&self) -> bool {
        match std::fs::symlink_metadata(&self.path) {
            Ok(metadata) => Identity::of(&metadata) == self.identity,
            // Another error (EACCES on a parent, say) says nothing of removal.
            Err(error) => error.kind() != io::ErrorKind::NotFound,
        }
    }

    /// Once `path` no longer names the open file: a new file (the
    /// directory made again); `false` when none can be made, said once.
    fn follow_path(&mut self) -> bool {
        if self.still_at_path() {
            return true;
        }
        match new_file(&self.logdir, &self.filename_suffix) {
            Ok(made) => {
                eprintln!(
                    "torchmon: TensorboardEventHandler: {} was removed; later windows go to \
                     the new file {}",
                    self.path.display(),
                    made.path.display()
                );
                self.file = made.file;
                self.length = made.length;
                self.identity = made.identity;
                self.path = made.path;
                *self.shared_path.lock() = self.path.clone();
                true
            }
            Err(failed) => {
                if !self.failing {
                    self.failing = true;
                    eprintln!(
                        "torchmon: TensorboardEventHandler: {} was removed and no new file can \
                         be made ({failed}); windows are dropped until one can",
                        self.path.display()
                    );
                }
                false
            }
        }
    }

    /// The first write that works after `failing`: says how many windows
    /// were lost meanwhile.
    fn recovered(&mut self) {
        if std::mem::take(&mut self.failing) {
            let lost = std::mem::take(&mut self.lost);
            eprintln!(
                "torchmon: TensorboardEventHandler: writing to {} again; {lost} {} lost meanwhile",
                self.path.display(),
                if lost == 1 {
                    "window was"
                } else {
                    "windows were"
                }
            );
        }
    }

    /// Empties the batch, counting its windows as lost unless `written`.
    fn end_batch(&mut self, written: bool) {
        if !written {
            self.lost += self.batch;
        }
        self.record.clear();
        self.batch = 0;
    }

    /// Appends the records encoded so far with one write: all of them, or
    /// (on an error) none, the part already written cut off again so that a
    /// reader never meets a torn record before later ones.
    fn write_out(&mut self) {
        if self.record.is_empty() {
            return;
        }
        if self.checked.elapsed() >= PATH_CHECK {
            self.checked = Instant::now();
            if !self.follow_path() {
                self.end_batch(false);
                return;
            }
        }
        let written = match self.file.write_all(&self.record) {
            Ok(()) => {
                self.length += self.record.len() as u64;
                self.recovered();
                true
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
                false
            }
        };
        self.end_batch(written);
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

    fn window(step: i64) -> SummaryEvent {
        SummaryEvent {
            wall_time: step as f64,
            step,
            scalars: vec![("loss.mean".to_owned(), step as f64)],
            histograms: vec![],
        }
    }

    #[test]
    fn a_removed_directory_gets_a_new_file_for_later_windows() {
        let dir = temp_dir("removed");
        let writer = EventFileWriter::create(&dir, "").unwrap();
        let first = writer.path();
        let deadline = || Instant::now() + Duration::from_secs(10);
        for step in 1..=3 {
            assert_eq!(writer.try_write(window(step)).unwrap(), Written::Queued);
        }
        assert!(writer.flush(deadline()));
        std::fs::remove_dir_all(&dir).unwrap();
        // The path is checked at most once per PATH_CHECK.
        std::thread::sleep(PATH_CHECK + Duration::from_millis(100));
        for step in 4..=6 {
            assert_eq!(writer.try_write(window(step)).unwrap(), Written::Queued);
        }
        assert!(writer.flush(deadline()));
        let second = writer.path();
        assert_ne!(first, second);
        assert_eq!(second.parent(), Some(dir.as_path()));
        let records = read_records(&std::fs::read(&second).unwrap());
        // file_version, then the three later windows.
        assert_eq!(records.len(), 4);
        assert!(
            records[0]
                .windows(FILE_VERSION.len())
                .any(|w| w == FILE_VERSION.as_bytes())
        );
        assert!(writer.close(Duration::from_secs(10)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_still_at_its_path_is_kept() {
        let dir = temp_dir("kept");
        let writer = EventFileWriter::create(&dir, "").unwrap();
        let first = writer.path();
        assert_eq!(writer.try_write(window(1)).unwrap(), Written::Queued);
        std::thread::sleep(PATH_CHECK + Duration::from_millis(100));
        assert_eq!(writer.try_write(window(2)).unwrap(), Written::Queued);
        assert!(writer.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(writer.path(), first);
        assert_eq!(read_records(&std::fs::read(&first).unwrap()).len(), 3);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        assert!(writer.close(Duration::from_secs(10)));
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
