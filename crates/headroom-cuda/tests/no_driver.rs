//! Without an NVIDIA driver (every CI machine): asking for a GPU is an
//! error that says what is missing, never a panic.

use headroom_cuda::{available, CudaDevice, Streams, Unavailable};

#[test]
fn without_a_driver_the_device_says_what_is_missing() {
    match available() {
        Err(Unavailable::NoDriver) => {
            let e = CudaDevice::new(0, Streams::Labels).err().expect("no device without a driver");
            assert_eq!(e, Unavailable::NoDriver);
            assert!(e.to_string().contains("libcuda.so"), "{e}");
        }
        Err(other) => {
            // A driver without a usable GPU: still an error, never a panic.
            assert!(CudaDevice::new(0, Streams::Labels).is_err(), "{other}");
        }
        Ok(count) => {
            let e = CudaDevice::new(count, Streams::Labels).err().expect("one past the last device");
            assert_eq!(e, Unavailable::NoDevice { ordinal: count, count });
        }
    }
}
