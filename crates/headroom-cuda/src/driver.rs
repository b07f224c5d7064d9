//! Finding and starting the driver, and its errors in headroom's terms.

use cudarc::driver::{result, sys};
use headroom_alloc::DeviceError;

/// Why no GPU can be used. Each says what is missing; none is a bug.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error(
        "the NVIDIA driver library (libcuda.so) is not on this machine: the CUDA backend needs an NVIDIA GPU and \
         its driver"
    )]
    NoDriver,
    #[error("the CUDA driver did not start (cuInit: {0})")]
    Init(String),
    #[error("there is no CUDA device {ordinal}: the driver sees {count}")]
    NoDevice { ordinal: u32, count: u32 },
    #[error("CUDA device {ordinal}: {call} failed ({error})")]
    Setup { ordinal: u32, call: &'static str, error: String },
}

/// Loads and starts the driver; how many devices it sees.
pub fn available() -> Result<u32, Unavailable> {
    // SAFETY: tries to open the library and makes no driver call. Without this check the
    // first call below would panic instead of returning an error.
    if !unsafe { sys::is_culib_present() } {
        return Err(Unavailable::NoDriver);
    }
    result::init().map_err(|e| Unavailable::Init(describe(e)))?;
    let count = result::device::get_count().map_err(|e| Unavailable::Init(describe(e)))?;
    Ok(count.max(0) as u32)
}

/// A driver error as text: its name and number. Only called once the library is loaded
/// (naming an error is itself a driver call).
pub(crate) fn describe(e: result::DriverError) -> String {
    let code = e.0 as i32;
    match e.error_name() {
        Ok(name) => format!("{} ({code})", name.to_string_lossy()),
        Err(_) => format!("CUDA error {code}"),
    }
}

pub(crate) fn is(e: &result::DriverError, code: sys::CUresult) -> bool {
    e.0 == code
}

/// A failed call that is neither out of memory nor the caller's mistake.
pub(crate) fn backend(call: &str, e: result::DriverError) -> DeviceError {
    DeviceError::Backend(format!("{call}: {}", describe(e)))
}
