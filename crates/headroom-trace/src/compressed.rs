//! Inputs as users keep them: a snapshot or trace may be gzip-compressed
//! (`run.pickle.gz`), and is then decompressed as it is read, never whole
//! in memory. Compression is told by the gzip magic bytes, not the file name.

use flate2::bufread::MultiGzDecoder;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

/// The two bytes every gzip member begins with (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Buffer for the decompressed stream: a pickle's opcodes are read a few
/// bytes at a time, so reads are served from here rather than the decoder.
const BUFFER: usize = 1 << 16;

/// Whether `prefix` (the start of a file) is gzip-compressed.
pub fn is_gzip(prefix: &[u8]) -> bool {
    prefix.starts_with(&GZIP_MAGIC)
}

/// `reader`, decompressed as it is read when it starts with gzip's magic
/// bytes (every member of a multi-member file, as `gzip -c a b` writes),
/// and as it is otherwise.
pub fn decompressing<'a, R: BufRead + 'a>(mut reader: R) -> io::Result<Box<dyn BufRead + 'a>> {
    if is_gzip(reader.fill_buf()?) {
        Ok(Box::new(BufReader::with_capacity(BUFFER, MultiGzDecoder::new(reader))))
    } else {
        Ok(Box::new(reader))
    }
}

/// Opens `path` for reading, decompressed if it is gzip.
pub fn open(path: &Path) -> io::Result<Box<dyn BufRead>> {
    decompressing(BufReader::with_capacity(BUFFER, std::fs::File::open(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::{Read, Write};

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn read_all(r: impl BufRead) -> Vec<u8> {
        let mut out = Vec::new();
        decompressing(r).unwrap().read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn gzip_is_decompressed_and_plain_input_passes_through() {
        let text = b"{\"segments\": []}".repeat(1000);
        assert_eq!(read_all(&gzip(&text)[..]), text);
        assert_eq!(read_all(&text[..]), text);
        assert_eq!(read_all(&b""[..]), b"");
    }

    #[test]
    fn every_member_of_a_concatenated_file_is_read() {
        let mut two = gzip(b"first ");
        two.extend(gzip(b"second"));
        assert_eq!(read_all(&two[..]), b"first second");
    }

    #[test]
    fn a_truncated_stream_is_an_error_not_a_short_read() {
        let z = gzip(&b"0123456789".repeat(10_000));
        let mut out = Vec::new();
        let r = decompressing(&z[..z.len() / 2]).unwrap().read_to_end(&mut out);
        assert!(r.is_err(), "read {} bytes of a cut stream without an error", out.len());
    }
}
