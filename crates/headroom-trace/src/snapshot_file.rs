//! Snapshots as files PyTorch's tools open: the dict of
//! `torch.cuda.memory._snapshot()`, pickled (protocol 4, which
//! pytorch.org/memory_viz and `torch.cuda._memory_viz` read) or as JSON
//! (which the newer viewer tries first).

use crate::py::{write_pickle, Py};
use headroom_alloc::{AllocatorConfig, Snapshot, TraceEntry};
use std::io::{self, Write};

/// Which encoding to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotFormat {
    Pickle,
    Json,
}

impl SnapshotFormat {
    /// JSON for a `.json` path, pickle otherwise (PyTorch's `_dump_snapshot` writes `.pickle`).
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("json") => SnapshotFormat::Json,
            _ => SnapshotFormat::Pickle,
        }
    }
}

/// Writes a snapshot in `format`.
pub fn write_snapshot<W: Write>(snap: &Snapshot, format: SnapshotFormat, out: &mut W) -> io::Result<()> {
    let value = snapshot_to_py(snap);
    match format {
        SnapshotFormat::Pickle => write_pickle(&value, out),
        SnapshotFormat::Json => {
            let mut w = io::BufWriter::new(out);
            serde_json::to_writer(&mut w, &value).map_err(io::Error::other)?;
            w.flush()
        }
    }
}

/// The snapshot as the Python dict PyTorch builds, key for key.
pub fn snapshot_to_py(snap: &Snapshot) -> Py {
    let segments = snap
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| {
                    Py::dict([
                        ("address", Py::uint(b.address)),
                        ("size", Py::uint(b.size)),
                        ("requested_size", Py::uint(b.requested_size)),
                        ("state", Py::str(b.state.name())),
                        ("frames", Py::List(vec![])),
                    ])
                })
                .collect();
            Py::dict([
                ("device", Py::Int(s.device.into())),
                ("address", Py::uint(s.address)),
                ("total_size", Py::uint(s.total_size)),
                ("allocated_size", Py::uint(s.allocated_size)),
                ("active_size", Py::uint(s.active_size)),
                ("requested_size", Py::uint(s.requested_size)),
                ("stream", Py::uint(s.stream)),
                ("segment_type", Py::str(s.segment_type.name())),
                ("segment_pool_id", Py::Tuple(vec![Py::Int(0), Py::Int(0)])),
                ("is_expandable", Py::Bool(s.is_expandable)),
                ("frames", Py::List(vec![])),
                ("blocks", Py::List(blocks)),
            ])
        })
        .collect();
    let traces = snap.device_traces.iter().map(|t| Py::List(t.iter().map(trace_entry).collect())).collect();
    Py::dict([
        ("segments", Py::List(segments)),
        ("device_traces", Py::List(traces)),
        ("allocator_settings", settings(&snap.allocator_settings)),
        ("external_annotations", Py::List(vec![])),
    ])
}

fn trace_entry(e: &TraceEntry) -> Py {
    // PyTorch stores the device's free bytes in the address slot of an `oom`
    // entry and names the key `device_free` there.
    let addr_key = if e.device_free.is_some() { "device_free" } else { "addr" };
    Py::dict([
        ("action", Py::str(e.action.name())),
        (addr_key, Py::uint(e.device_free.unwrap_or(e.addr))),
        ("size", Py::uint(e.size)),
        ("stream", Py::uint(e.stream)),
        ("time_us", Py::Int(e.time_us)),
        ("frames", Py::List(vec![])),
    ])
}

fn settings(c: &AllocatorConfig) -> Py {
    let divisions = (0..c.roundup_power2_divisions.len())
        .map(|i| (Py::str((1u64 << i).to_string()), Py::uint(c.roundup_power2_divisions[i])))
        .collect();
    Py::dict([
        ("PYTORCH_CUDA_ALLOC_CONF", Py::str(c.raw.clone())),
        ("max_split_size", if c.max_split_size == u64::MAX { Py::Int(-1) } else { Py::uint(c.max_split_size) }),
        ("garbage_collection_threshold", Py::Float(c.garbage_collection_threshold)),
        ("expandable_segments", Py::Bool(c.expandable_segments)),
        ("pinned_num_register_threads", Py::uint(c.pinned_num_register_threads)),
        ("release_lock_on_cudamalloc", Py::Bool(c.release_lock_on_cudamalloc)),
        ("pinned_use_cuda_host_register", Py::Bool(c.pinned_use_cuda_host_register)),
        ("roundup_power2_divisions", Py::Dict(divisions)),
        ("graph_capture_record_stream_reuse", Py::Bool(c.graph_capture_record_stream_reuse)),
    ])
}
