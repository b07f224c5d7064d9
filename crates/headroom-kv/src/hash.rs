//! Block hashes: the identity of a full block of tokens for prefix caching.
//!
//! Block i's hash is H(hash of block i−1, the block's token ids, extra keys),
//! with a fixed seed standing in for the parent of block 0, so equal hashes
//! mean equal prefixes up to and including the block. H is BLAKE3 in keyed
//! mode with the parent hash as the key — the chaining BLAKE3 itself uses
//! between the blocks of a message — so a block of 16 token ids (64 bytes)
//! costs exactly one compression. BLAKE3 is collision-resistant: a collision
//! would hand one tenant another's KV (vLLM advisory GHSA-rm76-4mrf-v9r8).
//! vLLM's default, pickle + SHA-256, takes ~1.6 µs a block on this machine;
//! see docs/PERFORMANCE.md.

use std::hash::{Hash, Hasher};

/// A 256-bit block hash.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl Hash for BlockHash {
    // The bytes are already uniformly distributed: feed 8 of them to the map's hasher.
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes")));
    }
}

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…")
    }
}

/// Domain separation for the seed.
const SEED_KEY: [u8; 32] = *b"headroom-kv prefix cache block h";

/// Stands in for the parent of the first block.
pub fn none_hash() -> BlockHash {
    BlockHash(blake3::keyed_hash(&SEED_KEY, b"headroom-kv: no parent block").into())
}

/// The hash of one full block.
///
/// `extra` carries what else identifies the content (a LoRA adapter, a
/// tenant's cache salt on the first block, multimodal input hashes); empty
/// for plain text. (BLAKE3 binds the input length, so blocks of different
/// sizes cannot collide by concatenation.)
pub fn hash_block(parent: &BlockHash, tokens: &[u32], extra: &[u8]) -> BlockHash {
    let mut buf = [0u8; 4 * 32];
    if extra.is_empty() && tokens.len() <= 32 {
        for (i, t) in tokens.iter().enumerate() {
            buf[4 * i..4 * i + 4].copy_from_slice(&t.to_le_bytes());
        }
        return BlockHash(blake3::keyed_hash(&parent.0, &buf[..4 * tokens.len()]).into());
    }
    let mut h = blake3::Hasher::new_keyed(&parent.0);
    for chunk in tokens.chunks(32) {
        for (i, t) in chunk.iter().enumerate() {
            buf[4 * i..4 * i + 4].copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..4 * chunk.len()]);
    }
    // The extra keys follow the tokens, with their length so they cannot be
    // confused with token bytes.
    h.update(extra);
    h.update(&(extra.len() as u32).to_le_bytes());
    BlockHash(h.finalize().into())
}

/// Hashes of the full blocks of `tokens`, chained from `none_hash()`;
/// `first_extra` goes into the first block only (a cache salt).
pub fn hash_blocks(tokens: &[u32], block_size: usize, first_extra: &[u8]) -> Vec<BlockHash> {
    let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = none_hash();
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        parent = hash_block(&parent, block, if i == 0 { first_extra } else { &[] });
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_equal_hashes_and_nothing_else() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999;
        let ha = hash_blocks(&a, 16, b"");
        let hb = hash_blocks(&b, 16, b"");
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3], "a change propagates to every later block");
        // The same block after a different prefix hashes differently.
        assert_ne!(hash_block(&ha[0], &a[16..32], b""), hash_block(&ha[1], &a[16..32], b""));
        // A salt isolates tenants.
        assert_ne!(hash_blocks(&a, 16, b"tenant-1")[3], ha[3]);
        // Partial blocks are not hashed.
        assert_eq!(hash_blocks(&a[..63], 16, b"").len(), 3);
    }
}
