//! Byte sizes on the command line: plain bytes, or a number with a unit
//! (`80GiB`, `24GB`, `1.5GiB`).

use anyhow::{anyhow, Result};

pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| anyhow!("{s:?} is not a size: {e} (write bytes, or e.g. 80GiB, 24GB)"))
}
