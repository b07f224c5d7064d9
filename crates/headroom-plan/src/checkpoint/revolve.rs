//! REVOLVE's closed form (Griewank & Walther, ACM TOMS 2000): the least
//! number of forward steps to reverse a chain of `l` uniform steps with `s`
//! snapshots, F(l, s) = t·l − β(s+1, t−1), where β(s, t) = C(s+t, s) and t
//! is the least repetition number with β(s, t) ≥ l. The model differs from
//! the heterogeneous one of the solver (no gradients or tapes are charged);
//! it is kept as the reference for uniform chains and checked against its
//! own dynamic program.

/// β(s, t) = C(s + t, s), saturating.
fn beta(s: u64, t: u64) -> u64 {
    let k = s.min(t);
    // Multiplicative formula over the smaller side, exact in u128 for the sizes used here.
    let n = s + t;
    let mut r = 1u128;
    for i in 1..=k {
        r = r * (n - k + i) as u128 / i as u128;
        if r > u64::MAX as u128 {
            return u64::MAX;
        }
    }
    r as u64
}

/// The optimal repetition number: the least t with β(s, t) ≥ l.
pub fn revolve_repetitions(l: u64, s: u64) -> u64 {
    assert!(s >= 1, "at least one snapshot");
    let mut t = 0;
    while beta(s, t) < l {
        t += 1;
    }
    t
}

/// F(l, s): the least forward steps (beyond the taped re-executions).
pub fn revolve_forwards(l: u64, s: u64) -> u64 {
    if l <= 1 {
        return 0;
    }
    let t = revolve_repetitions(l, s);
    t * l - beta(s + 1, t - 1)
}

/// The same by dynamic programming: F(l, 1) = l(l−1)/2 and
/// F(l, s) = min over 1 ≤ j < l of j + F(l−j, s−1) + F(j, s).
pub fn revolve_forwards_dp(l: usize, s: usize) -> u64 {
    let mut f = vec![vec![0u64; s + 1]; l + 1];
    for (len, row) in f.iter_mut().enumerate().skip(2) {
        row[1] = (len * (len - 1) / 2) as u64;
    }
    for len in 2..=l {
        for k in 2..=s {
            f[len][k] = (1..len).map(|j| j as u64 + f[len - j][k - 1] + f[j][k]).min().expect("len >= 2");
        }
    }
    f[l][s]
}
