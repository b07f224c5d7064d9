//! Snapshots as files PyTorch's tools open: the dict of
//! `torch.cuda.memory._snapshot()`, pickled (protocol 4, which
//! pytorch.org/memory_viz and `torch.cuda._memory_viz` read) or as JSON
//! (which the newer viewer tries first).

use crate::py::{Pickler, Py};
use headroom_alloc::{AllocatorConfig, Snapshot, TraceEntry};
use serde::ser::{SerializeMap, SerializeSeq};
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

/// Writes a snapshot in `format`. The device traces are encoded entry by
/// entry as they are written, so memory stays at the snapshot's own size
/// however long its trace.
pub fn write_snapshot<W: Write + ?Sized>(snap: &Snapshot, format: SnapshotFormat, out: &mut W) -> io::Result<()> {
    let w = io::BufWriter::new(out);
    match format {
        SnapshotFormat::Pickle => {
            let mut p = Pickler::new(w)?;
            p.begin_dict()?;
            p.value(&Py::str("segments"))?;
            p.value(&segments(snap))?;
            p.value(&Py::str("device_traces"))?;
            p.begin_list()?;
            for trace in &snap.device_traces {
                p.begin_list()?;
                for e in trace {
                    p.value(&trace_entry(e))?;
                }
                p.end()?;
            }
            p.end()?;
            for (key, value) in tail(snap) {
                p.value(&Py::str(key))?;
                p.value(&value)?;
            }
            p.end()?;
            p.finish()?;
            Ok(())
        }
        SnapshotFormat::Json => {
            let mut w = w;
            serde_json::to_writer(&mut w, &JsonSnapshot(snap)).map_err(io::Error::other)?;
            w.flush()
        }
    }
}

/// The snapshot as the Python dict PyTorch builds, key for key (the whole
/// value in memory; [`write_snapshot`] streams it instead).
pub fn snapshot_to_py(snap: &Snapshot) -> Py {
    let traces = snap.device_traces.iter().map(|t| Py::List(t.iter().map(trace_entry).collect())).collect();
    let mut items = vec![(Py::str("segments"), segments(snap)), (Py::str("device_traces"), Py::List(traces))];
    items.extend(tail(snap).into_iter().map(|(k, v)| (Py::str(k), v)));
    Py::Dict(items)
}

/// The keys after `device_traces`.
fn tail(snap: &Snapshot) -> [(&'static str, Py); 2] {
    [("allocator_settings", settings(&snap.allocator_settings)), ("external_annotations", Py::List(vec![]))]
}

/// The snapshot for serde_json, with the traces serialized entry by entry.
struct JsonSnapshot<'a>(&'a Snapshot);

struct JsonTraces<'a>(&'a [Vec<TraceEntry>]);

struct JsonTrace<'a>(&'a [TraceEntry]);

impl serde::Serialize for JsonSnapshot<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("segments", &segments(self.0))?;
        m.serialize_entry("device_traces", &JsonTraces(&self.0.device_traces))?;
        for (k, v) in tail(self.0) {
            m.serialize_entry(k, &v)?;
        }
        m.end()
    }
}

impl serde::Serialize for JsonTraces<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for t in self.0 {
            seq.serialize_element(&JsonTrace(t))?;
        }
        seq.end()
    }
}

impl serde::Serialize for JsonTrace<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for e in self.0 {
            seq.serialize_element(&trace_entry(e))?;
        }
        seq.end()
    }
}

fn segments(snap: &Snapshot) -> Py {
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
                ("segment_pool_id", pool_id(s.segment_pool_id)),
                ("is_expandable", Py::Bool(s.is_expandable)),
                ("frames", Py::List(vec![])),
                ("blocks", Py::List(blocks)),
            ])
        })
        .collect();
    Py::List(segments)
}

fn trace_entry(e: &TraceEntry) -> Py {
    // PyTorch stores the device's free bytes in the address slot of an `oom`
    // entry and names the key `device_free` there.
    let addr_key = if e.device_free.is_some() { "device_free" } else { "addr" };
    let mut fields = vec![
        ("action", Py::str(e.action.name())),
        (addr_key, Py::uint(e.device_free.unwrap_or(e.addr))),
        ("size", Py::uint(e.size)),
        ("stream", Py::uint(e.stream)),
        ("time_us", Py::Int(e.time_us)),
        ("frames", Py::List(vec![])),
    ];
    // A private pool's entries say which pool, as PyTorch's `TraceEntry` keeps it: what a
    // replay of the snapshot needs to put each request in its pool.
    if e.pool_id != headroom_alloc::DEFAULT_MEMPOOL {
        fields.push(("pool_id", pool_id(e.pool_id)));
    }
    Py::dict(fields)
}

/// A `MempoolId_t` as PyTorch's snapshot writes it: a tuple of two ints.
fn pool_id(id: headroom_alloc::MempoolId) -> Py {
    Py::Tuple(vec![Py::uint(id.0), Py::uint(id.1)])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::py::write_pickle;
    use headroom_alloc::{DeviceCachingAllocator, SimDevice};

    /// A snapshot whose trace crosses the pickle's 1,000-item batches.
    fn snapshot() -> Snapshot {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 30), AllocatorConfig::default());
        a.record_history(Some(10_000));
        let mut live = Vec::new();
        for i in 0..1500u64 {
            live.push(a.malloc((i % 7 + 1) << 18, i % 3).unwrap().ptr);
            if i % 2 == 1 {
                a.free(live.swap_remove(0)).unwrap();
            }
        }
        a.snapshot()
    }

    #[test]
    fn streamed_files_hold_the_whole_snapshot() {
        let snap = snapshot();
        assert!(snap.device_traces[0].len() > 2 * 1000);
        let mut whole = Vec::new();
        write_pickle(&snapshot_to_py(&snap), &mut whole).unwrap();
        let mut streamed = Vec::new();
        write_snapshot(&snap, SnapshotFormat::Pickle, &mut streamed).unwrap();
        let read = |b: &[u8]| serde_pickle::value_from_slice(b, serde_pickle::DeOptions::new()).unwrap();
        assert_eq!(read(&streamed), read(&whole));
        let mut json = Vec::new();
        write_snapshot(&snap, SnapshotFormat::Json, &mut json).unwrap();
        let from_json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(from_json, serde_json::to_value(snapshot_to_py(&snap)).unwrap());
    }

    #[test]
    fn stream_ids_above_i64_stay_exact() {
        assert_eq!(Py::uint(u64::MAX), Py::UInt(u64::MAX));
        let mut b = Vec::new();
        write_pickle(&Py::List(vec![Py::uint(u64::MAX), Py::uint(1 << 63), Py::uint(7)]), &mut b).unwrap();
        let v = serde_pickle::value_from_slice(&b, serde_pickle::DeOptions::new()).unwrap();
        let serde_pickle::Value::List(items) = v else { panic!("{v:?}") };
        assert_eq!(items[2], serde_pickle::Value::I64(7));
        assert_eq!(format!("{:?}", items[0]), format!("{:?}", serde_pickle::Value::Int(u64::MAX.into())));
        assert_eq!(serde_json::to_string(&Py::uint(u64::MAX)).unwrap(), "18446744073709551615");
    }
}
