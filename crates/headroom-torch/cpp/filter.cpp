// The one piece of the plug-in that must be C++: PyTorch hands a pluggable
// allocator's begin-allocate-to-pool hook a std::function<bool(cudaStream_t)>
// (the filter that says which streams allocate into the pool), by value. The
// hook receives a pointer to it (the Itanium C++ ABI passes a class with a
// non-trivial destructor by reference); these functions move it to the heap,
// call it, and destroy it, so that Rust keeps it only as an opaque pointer.
#include <functional>
#include <utility>

struct CUstream_st;
using Filter = std::function<bool(CUstream_st*)>;

extern "C" void* headroom_filter_take(Filter* f) {
  return new Filter(std::move(*f));
}

extern "C" bool headroom_filter_call(void* f, CUstream_st* stream) {
  return (*static_cast<Filter*>(f))(stream);
}

extern "C" void headroom_filter_drop(void* f) {
  delete static_cast<Filter*>(f);
}

// For the tests: calls `begin`, a hook of PyTorch's type, as PyTorch calls it,
// with a filter that accepts `accept` only.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using BeginHook = void (*)(int, MempoolId, Filter);

extern "C" void headroom_test_begin_as_pytorch(
    void* begin, int device, unsigned long long a, unsigned long long b, CUstream_st* accept) {
  Filter filter = [accept](CUstream_st* s) { return s == accept; };
  reinterpret_cast<BeginHook>(begin)(device, MempoolId{a, b}, std::move(filter));
}
