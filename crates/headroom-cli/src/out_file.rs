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
