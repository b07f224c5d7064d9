//! Byte units and the two ways PyTorch prints byte counts.

/// 1 KiB.
pub const KIB: u64 = 1 << 10;
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Formats a byte count the way PyTorch's OOM message does (`format_size` in
/// `CUDACachingAllocator.cpp`): whole bytes up to 1024, then two decimals of
/// the largest unit that keeps the value above one.
pub fn format_size(bytes: u64) -> String {
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_pytorch_thresholds() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(GIB), "1024.00 MiB");
        assert_eq!(format_size(80 * GIB), "80.00 GiB");
    }
}
