//! Block hashes: the identity of a full block of tokens for prefix caching.
//!
//! Block i's hash is H(hash of block i−1, the block's token ids, extra keys),
//! with a fixed seed standing in for the parent of block 0, so equal hashes
//! mean equal prefixes up to and including the block.
//!
//! H is BLAKE3's compression function keyed with the parent hash — the
//! chaining BLAKE3 itself uses between the blocks of a message — so a block of
//! 16 token ids (64 bytes, vLLM's default block size) costs exactly one
//! compression, and nothing around it:
//!
//! - a block of 16 tokens and no extra keys is one BLAKE3 compression with the
//!   parent hash as key: the root parent node whose two children are the
//!   block's two halves (`blake3::hazmat::merge_subtrees_root`, keyed mode);
//! - any other block (another size, or extra keys) is `blake3::keyed_hash` of
//!   its token bytes, the extra keys and their length, keyed with the parent
//!   hash — or, when that message is longer than one chunk (1 KiB), with a
//!   key derived from it: only such a message ends in a root parent node, so
//!   the two kinds of block never meet in one compression with one key.
//!
//! What this guarantees: two different prefixes get the same hash only
//! through a collision in BLAKE3's compression function (256-bit output, 128
//! bits of security against collisions, no known attack), the guarantee
//! vLLM's default gives with SHA-256 over the pickled block (vLLM moved to
//! SHA-256 for it: with Python's `hash`, a crafted prompt could collide with
//! another tenant's and be served their KV, advisory GHSA-rm76-4mrf-v9r8).
//! vLLM's faster option, xxHash's 128-bit XXH3, is not collision-resistant
//! against chosen prompts; nothing here trades that away. vLLM's default
//! takes 0.8–2.8 µs a block on the development machine (quiet to loaded),
//! headroom 65–80 ns; see docs/PERFORMANCE.md.

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
    static NONE: std::sync::LazyLock<BlockHash> =
        std::sync::LazyLock::new(|| BlockHash(blake3::keyed_hash(&SEED_KEY, b"headroom-kv: no parent block").into()));
    *NONE
}

/// The hash of one full block.
///
/// `extra` carries what else identifies the content (a LoRA adapter, a
/// tenant's cache salt on the first block, multimodal input hashes); empty
/// for plain text. (BLAKE3 binds the input length, so blocks of different
/// sizes cannot collide by concatenation.)
pub fn hash_block(parent: &BlockHash, tokens: &[u32], extra: &[u8]) -> BlockHash {
    if let (true, Ok(tokens)) = (extra.is_empty(), <&[u32; 16]>::try_from(tokens)) {
        // One compression: `keyed_hash` of the same 64 bytes costs a fifth more (its chunk
        // state and a copy of the block around the same compression), and this is all of
        // a block's hashing.
        let half = |h: &[u32]| {
            let mut out = [0u8; 32];
            for (o, t) in out.chunks_exact_mut(4).zip(h) {
                o.copy_from_slice(&t.to_le_bytes());
            }
            out
        };
        let mode = blake3::hazmat::Mode::KeyedHash(&parent.0);
        return BlockHash(blake3::hazmat::merge_subtrees_root(&half(&tokens[..8]), &half(&tokens[8..]), mode).into());
    }
    let key = if 4 * tokens.len() + extra.len() + 4 <= blake3::CHUNK_LEN {
        parent.0
    } else {
        // A message longer than a chunk ends in a root parent node, as the 16-token blocks
        // above do: a key of its own keeps the two apart.
        blake3::keyed_hash(&parent.0, b"headroom-kv: a block longer than a chunk").into()
    };
    let mut h = blake3::Hasher::new_keyed(&key);
    let mut buf = [0u8; 4 * 32];
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

    /// The 16-token block is BLAKE3 itself: one root parent node keyed with the parent hash,
    /// the node BLAKE3 ends a two-chunk message with. Checked against the crate's own
    /// incremental hasher on such a message, so a change that drops a flag or a key fails.
    #[test]
    fn a_sixteen_token_block_is_blakes_root_node_keyed_by_its_parent() {
        use blake3::hazmat::HasherExt;
        let parent = hash_blocks(&[9; 16], 16, b"")[0];
        let (left, right) = ([1u8; 1024], [2u8; 1024]);
        let cv = |input: &[u8], offset: u64| {
            blake3::Hasher::new_keyed(&parent.0).set_input_offset(offset).update(input).finalize_non_root()
        };
        let (l, r) = (cv(&left, 0), cv(&right, 1024));
        let tokens: Vec<u32> =
            l.chunks(4).chain(r.chunks(4)).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        let whole = blake3::Hasher::new_keyed(&parent.0).update(&left).update(&right).finalize();
        assert_eq!(hash_block(&parent, &tokens, b"").0, *whole.as_bytes());
    }

    /// A block longer than a chunk (300 tokens here) ends in a root parent node too: 16 tokens
    /// spelling its two children's chaining values would take its hash if it were keyed with
    /// the parent as they are. Its key is derived from the parent instead, so they do not.
    #[test]
    fn blocks_longer_than_a_chunk_never_share_a_root_node_with_sixteen_token_blocks() {
        use blake3::hazmat::HasherExt;
        let parent = none_hash();
        let long: Vec<u32> = (0..300).collect();
        let mut message: Vec<u8> = long.iter().flat_map(|t| t.to_le_bytes()).collect();
        message.extend_from_slice(&0u32.to_le_bytes());
        let cv = |input: &[u8], offset: u64| {
            blake3::Hasher::new_keyed(&parent.0).set_input_offset(offset).update(input).finalize_non_root()
        };
        let forged: Vec<u32> = cv(&message[..1024], 0)
            .chunks(4)
            .chain(cv(&message[1024..], 1024).chunks(4))
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let forged = hash_block(&parent, &forged, b"");
        // The forgery works against the message keyed with the parent (the control)...
        assert_eq!(forged.0, *blake3::keyed_hash(&parent.0, &message).as_bytes());
        // ...and not against the block, nor the same tokens with extra keys.
        assert_ne!(forged, hash_block(&parent, &long, b""));
        assert_ne!(hash_block(&parent, &long[..16], &[7u8; 2000]), hash_block(&parent, &long[..16], b""));
    }
}
