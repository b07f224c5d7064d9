//! The container the program templates are bundled in, `data/programs/*.tpl`
//! (docs/TRACE_FORMAT.md, "Program templates"; written by `scripts/validate/template_file.py`):
//! an index of the keys, then each template's JSON deflated on its own (zlib), so that reading
//! the index costs nothing to speak of and a plan inflates only the templates it uses.

use flate2::read::ZlibDecoder;
use std::io::Read;

const MAGIC: &[u8] = b"HRTPL\n";
const VERSION: u16 = 1;

/// One template of a file, deflated.
#[derive(Debug)]
pub(crate) struct Entry {
    deflated: &'static [u8],
    inflated: usize,
}

impl Entry {
    /// The template's JSON text.
    pub(crate) fn inflate(&self) -> Result<String, String> {
        let mut text = String::with_capacity(self.inflated);
        ZlibDecoder::new(self.deflated).read_to_string(&mut text).map_err(|e| format!("does not inflate: {e}"))?;
        if text.len() != self.inflated {
            return Err(format!("inflates to {} bytes, its index says {}", text.len(), self.inflated));
        }
        Ok(text)
    }
}

/// Reads a file's bytes in order, each read refusing to run past the end.
struct Cursor {
    bytes: &'static [u8],
    at: usize,
}

impl Cursor {
    fn take(&mut self, n: usize) -> Result<&'static [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end =
            end.ok_or_else(|| format!("truncated: {n} bytes wanted at byte {} of {}", self.at, self.bytes.len()))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes")) as usize)
    }
}

/// A file's templates by key, in the file's order (sorted), from its index alone.
pub(crate) fn index(file: &'static [u8]) -> Result<Vec<(&'static str, Entry)>, String> {
    let mut c = Cursor { bytes: file, at: 0 };
    if c.take(MAGIC.len()).ok() != Some(MAGIC) {
        return Err(format!("not a template file (no {:?} at its start)", String::from_utf8_lossy(MAGIC)));
    }
    let version = c.u16()?;
    if version != VERSION {
        return Err(format!("template file version {version}; this reads {VERSION}"));
    }
    // The recorders' header (versions, shapes): for the scripts, not the planner.
    let header = c.u32()?;
    c.take(header)?;
    let count = c.u32()?;
    let mut spans = Vec::with_capacity(count);
    for _ in 0..count {
        let len = c.u16()? as usize;
        let key = std::str::from_utf8(c.take(len)?).map_err(|e| format!("a key is not UTF-8: {e}"))?;
        spans.push((key, c.u32()?, c.u32()?, c.u32()?));
    }
    let data = &file[c.at..];
    spans
        .into_iter()
        .map(|(key, offset, length, inflated)| {
            let deflated = offset
                .checked_add(length)
                .and_then(|end| data.get(offset..end))
                .ok_or_else(|| format!("{key}: bytes {offset}..+{length} lie past the data's {}", data.len()))?;
            Ok((key, Entry { deflated, inflated }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{write::ZlibEncoder, Compression};
    use std::io::Write;

    /// A file as `template_file.py` writes it: `{"about":"t"}` for its header.
    fn file(entries: &[(&str, &str)]) -> &'static [u8] {
        let mut index = Vec::new();
        let mut data = Vec::new();
        for (key, text) in entries {
            let mut z = ZlibEncoder::new(Vec::new(), Compression::new(9));
            z.write_all(text.as_bytes()).expect("deflate");
            let z = z.finish().expect("deflate");
            index.extend((key.len() as u16).to_le_bytes());
            index.extend(key.as_bytes());
            for n in [data.len(), z.len(), text.len()] {
                index.extend((n as u32).to_le_bytes());
            }
            data.extend(z);
        }
        let header = br#"{"about":"t"}"#;
        let mut out = MAGIC.to_vec();
        out.extend(VERSION.to_le_bytes());
        out.extend((header.len() as u32).to_le_bytes());
        out.extend(header);
        out.extend((entries.len() as u32).to_le_bytes());
        out.extend(index);
        out.extend(data);
        Box::leak(out.into_boxed_slice())
    }

    #[test]
    fn each_template_inflates_on_its_own() {
        let f = file(&[("a/b", r#"{"x":1}"#), ("c", r#"{"error":"no"}"#)]);
        let got = index(f).expect("index");
        let keys: Vec<_> = got.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["a/b", "c"]);
        assert_eq!(got[1].1.inflate().expect("inflates"), r#"{"error":"no"}"#);
        assert_eq!(got[0].1.inflate().expect("inflates"), r#"{"x":1}"#);
    }

    /// Every cut of a file short of its end, and a wrong magic or version, is an error that
    /// says what is wrong, not a panic; a stream that does not match its index's length fails
    /// when inflated.
    #[test]
    fn a_damaged_file_is_refused() {
        let f = file(&[("a/b", r#"{"x":1}"#), ("c", r#"{"y":[1,2,3]}"#)]);
        for cut in 0..f.len() {
            let short: &'static [u8] = &f[..cut];
            if let Ok(entries) = index(short) {
                panic!("{cut} of {} bytes read as {} entries", f.len(), entries.len());
            }
        }
        let mut other = f.to_vec();
        other[0] = b'X';
        assert!(index(Box::leak(other.into_boxed_slice())).unwrap_err().contains("not a template file"));
        let mut newer = f.to_vec();
        newer[MAGIC.len()] = 2;
        assert!(index(Box::leak(newer.into_boxed_slice())).unwrap_err().contains("version 2"));
        let mut longer = f.to_vec();
        // The first entry's inflated length, after its key length, key, offset and length.
        let at = MAGIC.len() + 2 + 4 + br#"{"about":"t"}"#.len() + 4 + 2 + 3 + 8;
        longer[at] += 1;
        let entries = index(Box::leak(longer.into_boxed_slice())).expect("index");
        assert!(entries[0].1.inflate().unwrap_err().contains("its index says 8"));
        let mut flipped = f.to_vec();
        let last = flipped.len() - 3;
        flipped[last] ^= 0xff;
        let entries = index(Box::leak(flipped.into_boxed_slice())).expect("index");
        assert!(entries[1].1.inflate().is_err());
    }
}
