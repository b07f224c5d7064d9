//! Compiles the C++ shim that holds PyTorch's std::function filters (cpp/filter.cpp).
fn main() {
    println!("cargo:rerun-if-changed=cpp/filter.cpp");
    cc::Build::new().cpp(true).file("cpp/filter.cpp").flag_if_supported("-std=c++17").compile("headroom_filter");
}
