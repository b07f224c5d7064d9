//! Output files that are either complete or absent: written under a
//! temporary name beside the destination and renamed over it when done, so
//! a failure part-way (a full disk, a file-size limit, an error in a later
//! step) leaves no partial file and keeps whatever was there before.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file being written now, for the interrupt handler to remove.
static WRITING: Mutex<Option<PathBuf>> = Mutex::new(None);

/// On Ctrl-C, removes the file being written (if any) and exits with 130,
/// as a shell reports an interrupted command: an interrupted write leaves no
/// partial file behind, and the destination keeps what it had.
pub fn remove_partial_on_interrupt() {
    let _ = ctrlc::set_handler(|| {
        if let Ok(w) = WRITING.lock() {
            if let Some(p) = w.as_ref() {
                let _ = std::fs::remove_file(p);
            }
        }
        std::process::exit(130);
    });
}

/// Makes a write past the file-size limit (`ulimit -f`) fail with "File too large" rather than
/// end the process with SIGXFSZ: the failed write's partial file is then removed, and the
/// destination keeps what it had. Call first, before any thread starts (threads inherit it).
pub fn fail_writes_past_the_size_limit() {
    #[cfg(unix)]
    {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        set.add(Signal::SIGXFSZ);
        // Blocked, the signal stays pending and the write returns EFBIG.
        let _ = set.thread_block();
    }
}

/// Refuses an output path that is one of the command's inputs (writing it
/// would destroy the input) or a directory. Call before any work is done.
pub fn check_output(path: &Path, inputs: &[&Path]) -> Result<()> {
    if path == Path::new("-") {
        bail!(
            "\"-\" would be a file named \"-\": output to standard output is not supported here; give a file name \
             (./- for a file called that)"
        );
    }
    for input in inputs {
        if same_file::is_same_file(path, input).unwrap_or(false) {
            bail!("{} is also the input; give the output another name", path.display());
        }
    }
    if path.is_dir() {
        bail!("{} is a directory; give a file name", path.display());
    }
    Ok(())
}

/// Refuses `-` as an input path: it usually means standard input, which
/// snapshot commands do not read (they seek and re-read their file).
pub fn check_input(path: &Path) -> Result<()> {
    if path == Path::new("-") {
        bail!("\"-\": reading standard input is not supported; give the file's path (./- for a file called that)");
    }
    Ok(())
}

/// Writes `path` with `write`: into a temporary file in the same directory,
/// renamed over `path` once `write` succeeds. A path that exists and is not
/// a regular file (`/dev/null`, a pipe) is written in place.
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    let special = path.exists() && !path.is_file();
    if special {
        let mut f = OpenOptions::new().write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
        return finish(&mut f, write).with_context(|| format!("writing {}", path.display()));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Made here rather than with `tempfile`, whose files are private (0600): the finished file
    // gets the permissions any new file gets (0666 less the umask).
    let partial = Partial::new(dir.join(format!(".{name}.{}.partial", std::process::id())));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial.0)
        .with_context(|| format!("creating {} (a temporary file in {})", path.display(), dir.display()))?;
    finish(&mut f, write).with_context(|| format!("writing {}", path.display()))?;
    std::fs::rename(&partial.0, path).with_context(|| format!("renaming the finished file to {}", path.display()))?;
    // Renamed: nothing is left to remove (the drop's removal of the old name finds nothing).
    drop(partial);
    Ok(())
}

/// Writes every file of a set into `dir`, or none: a set of man pages with some
/// missing (or some from an older version beside new ones) is worse than
/// the old set whole. Each destination is checked before anything is
/// written, each file goes to a temporary file first, and the temporary
/// files are renamed into place only once all are written.
pub fn write_set_atomically(dir: &Path, pages: &[(String, String)]) -> Result<Vec<PathBuf>> {
    if dir.exists() && !dir.is_dir() {
        bail!("--out-dir {}: exists and is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, _) in pages {
        let path = dir.join(file);
        if path.exists() && !path.is_file() {
            bail!("{} exists and is not a regular file; no page was written", path.display());
        }
    }
    let mut temps: Vec<(PathBuf, PathBuf)> = Vec::new();
    let cleanup = |temps: &[(PathBuf, PathBuf)]| {
        for (tmp, _) in temps {
            let _ = std::fs::remove_file(tmp);
        }
    };
    for (file, text) in pages {
        let (tmp, path) = (dir.join(format!(".{file}.{}.tmp", std::process::id())), dir.join(file));
        if let Err(e) = std::fs::write(&tmp, text) {
            let _ = std::fs::remove_file(&tmp);
            cleanup(&temps);
            return Err(e).with_context(|| format!("writing {}; no page was written", path.display()));
        }
        temps.push((tmp, path));
    }
    for (k, (tmp, path)) in temps.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp, path) {
            cleanup(&temps[k..]);
            return Err(e).with_context(|| {
                format!("renaming into {}; {k} of {} pages were written before it", path.display(), temps.len())
            });
        }
    }
    Ok(temps.into_iter().map(|(_, path)| path).collect())
}

/// A file being written; removed unless it was renamed into place.
struct Partial(PathBuf);

impl Partial {
    fn new(path: PathBuf) -> Partial {
        if let Ok(mut w) = WRITING.lock() {
            *w = Some(path.clone());
        }
        Partial(path)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Ok(mut w) = WRITING.lock() {
            *w = None;
        }
    }
}

fn finish(f: &mut File, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let mut w = BufWriter::new(f);
    write(&mut w)?;
    w.flush()?;
    w.get_ref().sync_all().or_else(|e| if e.kind() == io::ErrorKind::InvalidInput { Ok(()) } else { Err(e) })
}
