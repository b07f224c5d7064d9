//! The seeded draws of the tests' synthetic workloads: Marsaglia's xorshift64, so a seed names
//! one workload on every platform and no test depends on a random-number crate's stream.

/// A draw in `0..n` each call, from `seed`'s stream (a zero seed would stay zero: it is made odd).
pub fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed | 1;
    move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}
