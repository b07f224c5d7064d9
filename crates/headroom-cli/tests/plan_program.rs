//! `headroom plan --program`: a recorded step replayed as `plan` replays its own programs.

use assert_cmd::Command;
use predicates::boolean::PredicateBooleanExt;
use predicates::str::contains;
use serde_json::Value;
use std::path::Path;

fn headroom() -> Command {
    Command::cargo_bin("headroom").unwrap()
}

fn plan(args: &[&str]) -> (i32, Value) {
    let out = headroom().arg("plan").args(args).arg("--json").output().unwrap();
    let code = out.status.code().unwrap();
    assert!(code < 2, "{}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

/// The figures a plan's verdict rests on.
fn verdict(v: &Value) -> [Value; 8] {
    [
        "fits",
        "allocated_bytes",
        "reserved_bytes",
        "margin_bytes",
        "peak_phase",
        "phase_peaks",
        "breakdown",
        "device_mallocs",
    ]
    .map(|k| v[k].clone())
}

/// A job's program dumped, then planned from the file: the same verdict and peaks, on a GPU
/// where it fits, on one where it runs out, and under other allocator settings.
#[test]
fn a_dumped_program_plans_as_the_job_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("step.jsonl");
    let f = file.to_str().unwrap();
    let job = ["--model", "gpt2", "--gpu", "l4", "--batch", "4", "--seq", "1024", "--precision", "bf16"];
    let (_, built) = plan(&[&job[..], &["--dump-program", f]].concat());
    assert_eq!(built["runner"]["builder"], "transformers");
    let shape = ["--model", "gpt2", "--gpu", "l4", "--batch", "4", "--seq", "1024"];
    for extra in [
        &[][..],
        &["--gpu-memory", "3GiB"],
        &["--alloc-conf", "expandable_segments:True"],
        &["--policy", "headroom"],
        &["--alloc-conf", "garbage_collection_threshold:0.6,max_split_size_mb:128"],
    ] {
        let (code_a, a) = plan(&[&job[..], extra].concat());
        let (code_b, b) = plan(&[&shape[..], &["--program", f], extra].concat());
        assert_eq!(code_a, code_b, "{extra:?}");
        assert_eq!(verdict(&a), verdict(&b), "{extra:?}");
        assert_eq!(b["runner"]["builder"], "recording");
        assert_eq!(b["program"]["source"], "recording");
        assert!(b["step_time_s"].is_null());
    }
    // Round trip: the recording dumps itself unchanged.
    let again = dir.path().join("again.jsonl");
    plan(&[&shape[..], &["--program", f, "--dump-program", again.to_str().unwrap()]].concat());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), std::fs::read_to_string(&again).unwrap());
}

#[test]
fn the_text_names_the_recording_and_the_peak() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("step.jsonl");
    let f = file.to_str().unwrap();
    headroom().args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "512", "--dump-program", f]).assert().success();
    headroom()
        .args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "512", "--gpu-memory", "1GiB", "--program", f])
        .assert()
        .code(1)
        .stdout(contains("the step recorded in"))
        .stdout(contains("does NOT fit"))
        .stdout(contains("runs out of memory in step 1's"))
        .stdout(contains("step time: not estimated"));
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn a_bad_recording_is_refused_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let ok = "{\"op\":\"alloc\",\"id\":\"0 step1.forward activations m\",\"size\":10}\n";
    for (text, msg) in [
        (format!("{ok}{{\"op\":\"free\",\"id\":\"9\"}}\n"), "line 2: frees \"9\", which is not live"),
        (format!("\n{ok}{ok}"), "line 3: allocates \"0 step1.forward activations m\", which is still live"),
        ("{\"op\":\"alloc\",\"id\":7,\"size\":10}\n".to_string(), "line 1: id \"7\" is not a step program's"),
        ("{\"op\":\"alloc\",\"id\":\"0 step1.forward params m\",\"size\":1}\n".into(), "\"params\" is not one of"),
        ("{\"op\":\"alloc\",\"id\":\"0 step1.sideways weights m\",\"size\":1}\n".into(), "is not setup or step<N>"),
        (format!("{ok}{{\"op\":\"record_stream\",\"id\":\"0\",\"stream\":1}}\n"), "line 2: \"record_stream\""),
        (format!("{ok}{{\"op\":\"alloc\",\"id\":\"1 step1.forward weights m\",\"size\":1,\"dtype\":1}}\n"), "line 2"),
        (
            format!("{ok}{{\"op\":\"alloc\",\"id\":\"1 setup weights m\",\"size\":1}}\n"),
            "line 2: \"1 setup weights m\" is made in step 0's setup after step 1's forward",
        ),
        ("not json\n".into(), "line 1: not a trace line"),
        ("\n\n".into(), "holds no allocation"),
        ("{\"op\":\"alloc\",\"id\":\"0 setup weights m\",\"size\":1}\n".into(), "holds no step"),
    ] {
        let f = write(dir.path(), "bad.jsonl", &text);
        headroom()
            .args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "64", "--program", &f])
            .assert()
            .code(2)
            .stderr(contains(f.as_str()))
            .stderr(contains(msg));
    }
    headroom()
        .args(["plan", "--model", "gpt2", "--gpu", "l4", "--program", "/nonexistent/step.jsonl"])
        .assert()
        .code(2)
        .stderr(contains("/nonexistent/step.jsonl"));
}

/// What shapes a program is the recording's: each such flag is refused by name, as are the
/// questions a single recorded shape cannot answer.
#[test]
fn settings_a_recording_brings_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "s.jsonl", "{\"op\":\"alloc\",\"id\":\"0 step1.forward activations m\",\"size\":10}\n");
    for (flags, msg) in [
        (&["--precision", "bf16"][..], "--precision shapes the step program"),
        (&["--optimizer", "sgd"], "--optimizer shapes"),
        (&["--checkpoint", "selective"], "--checkpoint shapes"),
        (&["--finetune", "lora"], "--finetune shapes"),
        (&["--gpus", "8", "--tp", "2"], "--tp shapes"),
        (&["--framework", "hf"], "--framework shapes"),
        (&["--attention", "eager"], "--attention shapes"),
        (&["--accumulation", "4"], "--accumulation shapes"),
        (&["--loss-lives", "inline"], "--loss-lives shapes"),
        (&["--max-batch"], "--max-batch: --program"),
        (&["--max-seq"], "record the step at two or three shapes"),
        (&["--infer"], "cannot be used with"),
    ] {
        headroom()
            .args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "64", "--program", &f])
            .args(flags)
            .assert()
            .code(2)
            .stderr(contains(msg));
    }
    let out =
        headroom().args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "64", "--program", &f]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("the peak is in the forward"), "{text}");
}

/// A recording that holds its kernels is timed from them: its JSON's time keys are numbers whose
/// parts add up to the step, and its text says the step time and where it goes. One recorded
/// without kernels (the checkpointed GPT-2 step) has no step time: its time keys are all null
/// and its text says why.
#[test]
fn a_recording_is_timed_from_its_kernels_and_one_without_is_not() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/recordings/");
    let on = |gpu: &'static str, file: &str| {
        let shape = ["--model", "gpt2", "--gpu", gpu, "--batch", "4", "--seq", "1024", "--program"];
        let path = dir.join(file).to_str().unwrap().to_string();
        shape.iter().map(|s| s.to_string()).chain([path]).collect::<Vec<String>>()
    };
    let run = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, v) = plan(&args);
        let text = String::from_utf8(headroom().arg("plan").args(&args).output().unwrap().stdout).unwrap();
        (code, v, text)
    };

    let (_, v, text) = run(&on("h100", "gpt2-bf16-b4-s1024.jsonl"));
    assert_eq!(v["program"]["source"], "recording");
    let step = v["step_time_s"].as_f64().unwrap();
    let b = &v["step_time_breakdown"];
    let parts: f64 =
        ["compute_s", "memory_bound_s", "launch_s", "communication_s"].iter().map(|k| b[k].as_f64().unwrap()).sum();
    assert!(step > 0.0 && (parts - step).abs() < 1e-9 * step, "{v}");
    assert!(b["compute_s"].as_f64().unwrap() > 0.0 && b["memory_bound_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(text.contains("step time ≈") && text.contains("of which compute"), "{text}");
    assert!(text.contains("kernels timed"), "{text}");
    // With checkpointing it was not recorded with, the backward's recomputation is not in it.
    let (_, v, text) =
        run(&[on("h100", "gpt2-bf16-b4-s1024.jsonl"), vec!["--checkpoint".into(), "full".into()]].concat());
    assert!(v["step_time_s"].is_null(), "{v}");
    assert!(
        text.contains("step time: not estimated (the recorded kernels are of the step without checkpointing"),
        "{text}"
    );

    let (_, v, text) = run(&on("h100", "gpt2-bf16-b4-s1024-ckpt.jsonl"));
    for k in ["step_time_s", "layer_time_s", "step_time_breakdown", "tokens_per_s", "mfu", "recompute_fraction"] {
        assert!(v.get(k).is_some_and(Value::is_null), "{k}: {v}");
    }
    assert!(text.contains("the step recorded in"), "{text}");
    assert!(!text.contains("step time ≈") && !text.contains("of which compute"), "{text}");
    let untimed: Vec<&str> = text.lines().filter(|l| l.starts_with("step time")).collect();
    assert_eq!(
        untimed,
        ["step time: not estimated (the recording holds the step's allocations but not its kernels: record it again \
          to time it)"],
        "{text}"
    );
    // Where it does not fit, the levers planned again are untimed too.
    let (code, v, _) =
        run(&[on("l4", "gpt2-bf16-b4-s1024-ckpt.jsonl"), vec!["--gpu-memory".into(), "3GiB".into()]].concat());
    assert_eq!(code, 1);
    let levers = v["levers"].as_array().unwrap();
    assert!(!levers.is_empty() && levers.iter().all(|l| l["step_time_s"].is_null()), "{v}");
}

/// A compiled step (`record --compile`, which marks it `{"op":"compiled"}`) holds no kernels by
/// design: the plan says why it has no step time and points to the eager recording, not to
/// recording it again (which would give the same); a compiled line after an operation is
/// refused with its line.
#[test]
fn a_compiled_recording_says_why_it_has_no_step_time() {
    let rec = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/recordings/llama-tiny-compiled-b2-s64.jsonl");
    let args = ["--gpu", "h100", "--program", rec];
    let (code, v) = plan(&args);
    assert_eq!(code, 0);
    assert_eq!(v["program"]["source"], "recording");
    for k in ["step_time_s", "step_time_breakdown", "tokens_per_s", "mfu"] {
        assert!(v.get(k).is_some_and(Value::is_null), "{k}: {v}");
    }
    let text = String::from_utf8(headroom().arg("plan").args(args).output().unwrap().stdout).unwrap();
    let untimed: Vec<&str> = text.lines().filter(|l| l.starts_with("step time")).collect();
    assert_eq!(untimed.len(), 1, "{text}");
    assert!(untimed[0].starts_with("step time: not estimated (the step was recorded compiled"), "{text}");
    assert!(untimed[0].contains("record the step without --compile"), "{text}");
    assert!(!text.contains("record it again to time it"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("late.jsonl");
    let body = std::fs::read_to_string(rec).unwrap();
    let mut lines: Vec<&str> = body.lines().collect();
    let marker = lines.remove(1);
    assert_eq!(marker, r#"{"op":"compiled"}"#);
    lines.insert(2, marker);
    std::fs::write(&late, lines.join("\n")).unwrap();
    headroom()
        .args(["plan", "--gpu", "h100", "--program", late.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(contains("line 3").and(contains("a compiled line comes before any operation")));
}

/// A recording made without checkpointing, planned with it: each layer's saved activations are
/// dropped after its forward and made again before its backward, so the step needs less; a
/// recording that names no layer is refused, and the text says the layers were checkpointed.
#[test]
fn a_recording_is_planned_with_its_layers_checkpointed() {
    let rec = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/recordings/gpt2-bf16-b4-s1024.jsonl");
    let args = ["--model", "gpt2", "--gpu", "h100", "--batch", "4", "--seq", "1024", "--program", rec];
    let allocated = |extra: &[&str]| {
        let (code, v) = plan(&[&args[..], extra].concat());
        assert_eq!(code, 0);
        v["allocated_bytes"].as_f64().unwrap()
    };
    let (none, every2, full) =
        (allocated(&[]), allocated(&["--checkpoint", "every-2"]), allocated(&["--checkpoint", "full"]));
    assert!(full < every2 && every2 < none, "{full} {every2} {none}");
    // GPT-2's twelve layers at 4 × 1,024 tokens keep about 2 GiB for the backward.
    assert!(none - full > 1.5 * (1u64 << 30) as f64, "{none} - {full}");
    let out = headroom().arg("plan").args(args).args(["--checkpoint", "full"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("its layers checkpointed"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "s.jsonl",
        "{\"op\":\"alloc\",\"id\":\"0 step1.forward activations MmBackward0\",\"size\":10}\n\
         {\"op\":\"alloc\",\"id\":\"1 step1.backward gradients MmBackward0\",\"size\":10}\n",
    );
    headroom()
        .args(["plan", "--model", "gpt2", "--gpu", "l4", "--seq", "64", "--program", &f, "--checkpoint", "full"])
        .assert()
        .code(2)
        .stderr(contains("no layer to checkpoint"));
}

/// The check-only row of docs/VALIDATION.md: GPT-2's step recorded without checkpointing and
/// planned with `--checkpoint full`, against the same step recorded with transformers'
/// checkpointing. Tolerances declared before the comparison: allocated within 3%, reserved 5%.
#[test]
fn a_recording_checkpointed_by_the_transform_is_the_one_recorded_checkpointed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/recordings/");
    let shape = ["--model", "gpt2", "--gpu", "h100", "--batch", "4", "--seq", "1024"];
    let plain = format!("{dir}gpt2-bf16-b4-s1024.jsonl");
    let ckpt = format!("{dir}gpt2-bf16-b4-s1024-ckpt.jsonl");
    let (_, ours) = plan(&[&shape[..], &["--program", &plain, "--checkpoint", "full"]].concat());
    let (_, recorded) = plan(&[&shape[..], &["--program", &ckpt]].concat());
    for (key, tolerance) in [("allocated_bytes", 0.03), ("reserved_bytes", 0.05)] {
        let (a, b) = (ours[key].as_f64().unwrap(), recorded[key].as_f64().unwrap());
        assert!((a - b).abs() <= tolerance * b, "{key}: {a} against {b}");
    }
}

/// GPT-2's step recorded at two or three shapes: `--batch` and `--seq` plan other shapes from
/// the laws fitted, and `--max-batch` and `--max-seq` search them; one recording plans its
/// own shape only.
#[test]
fn recordings_at_two_or_three_shapes_plan_and_search_other_shapes() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/recordings/");
    let [b2s512, b2s1024, b4s1024] =
        ["gpt2-bf16-b2-s512.jsonl", "gpt2-bf16-b2-s1024.jsonl", "gpt2-bf16-b4-s1024.jsonl"]
            .map(|f| format!("{dir}{f}"));
    let gpu = ["--model", "gpt2", "--gpu", "l4"];
    let two = [&gpu[..], &["--program", &b2s512, "--program", &b4s1024]].concat();
    let three = [&two[..], &["--program", &b2s1024]].concat();
    // The third shape, planned from the other two, is the one recorded there.
    let (_, fitted) = plan(&[&two[..], &["--batch", "2", "--seq", "1024"]].concat());
    let (_, recorded) = plan(&[&gpu[..], &["--program", &b2s1024]].concat());
    let (a, b) = (fitted["allocated_bytes"].as_f64().unwrap(), recorded["allocated_bytes"].as_f64().unwrap());
    assert!((a - b).abs() <= 0.001 * b, "{a} against {b}");
    assert!(fitted["program"]["file"]
        .as_str()
        .unwrap()
        .contains("size laws fitted from batch × seq 2 × 512, 4 × 1024"));
    // Only 4 × 1024's file holds kernels: that shape is timed, and another one is not.
    assert!(plan(&[&two[..], &["--batch", "4", "--seq", "1024"]].concat()).1["step_time_s"].is_f64());
    assert!(fitted["step_time_s"].is_null(), "{fitted}");
    // --max-batch: the largest micro-batch whose plan fits, and the next one does not.
    for args in [&two, &three] {
        let (code, v) = plan(&[&args[..], &["--max-batch", "--max-seq"]].concat());
        assert_eq!(code, 0);
        let most = v["max_batch"].as_u64().unwrap();
        assert!((16..1000).contains(&most), "{v}");
        assert_eq!(v["max_seq"], 1024, "{v}");
        let at = |b: u64| plan(&[&args[..], &["--batch", &b.to_string(), "--seq", "512"]].concat()).0;
        assert_eq!((at(most), at(most + 1)), (0, 1));
    }
    // Where it does not fit, a smaller micro-batch is a lever.
    let (code, v) = plan(&[&two[..], &["--batch", "8", "--seq", "1024", "--gpu-memory", "4GiB"]].concat());
    assert_eq!(code, 1);
    let levers = v["levers"].as_array().unwrap();
    assert!(levers.iter().any(|l| l["flags"] == "--batch 2" && l["fits"] == true), "{v}");
    // One recording, or shapes that never vary the sequence: refused, saying what to record.
    headroom()
        .arg("plan")
        .args(gpu)
        .args(["--program", &b4s1024, "--max-batch"])
        .assert()
        .code(2)
        .stderr(contains("holds one shape's sizes"))
        .stderr(contains("record the step at two or three shapes"));
    headroom()
        .arg("plan")
        .args(gpu)
        .args(["--program", &b2s1024, "--program", &b4s1024, "--seq", "512"])
        .assert()
        .code(2)
        .stderr(contains("--seq 512: every recording is at --seq 1024"));
    // Not the same step: refused, naming the line in each file.
    let ckpt = format!("{dir}gpt2-bf16-b4-s1024-ckpt.jsonl");
    headroom()
        .arg("plan")
        .args(gpu)
        .args(["--program", &b2s1024, "--program", &ckpt])
        .assert()
        .code(2)
        .stderr(contains("gpt2-bf16-b4-s1024-ckpt.jsonl line 183: free"))
        .stderr(contains("gpt2-bf16-b2-s1024.jsonl line 183 has alloc"));
}

/// A model type the catalog has no recipe for is refused by name, with the way to plan it
/// anyway: record its step without a GPU and plan the recording.
#[test]
fn an_unsupported_model_type_says_how_to_record_and_plan_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "config.json", r#"{"model_type":"mamba","hidden_size":768,"num_hidden_layers":24}"#);
    headroom()
        .args(["plan", "--model", &f, "--gpu", "h100"])
        .assert()
        .code(2)
        .stderr(contains("model type `mamba` is not supported yet"))
        .stderr(contains("python -m headroom_gpu record --model CONFIG"))
        .stderr(contains("headroom plan --gpu h100 --program step.jsonl"));
}

fn recording(file: &str) -> String {
    format!("{}/../../data/recordings/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// A recording planned without `--model` is its own model: the same replay and step time as
/// with the catalog's GPT-2, named by the module the recording names, with no figure only a
/// catalog model has. Without `--model` and without `--program`, plan says what to give.
#[test]
fn a_recording_plans_without_a_catalog_model() {
    let rec = recording("gpt2-bf16-b4-s1024.jsonl");
    let ours = ["--gpu", "h100", "--program", &rec];
    let (code, own) = plan(&ours);
    let (_, catalog) = plan(&[&ours[..], &["--model", "gpt2"]].concat());
    assert_eq!(code, 0);
    assert_eq!(verdict(&own), verdict(&catalog));
    assert_eq!(own["step_time_s"], catalog["step_time_s"]);
    assert_eq!(own["layer_time_s"], catalog["layer_time_s"]);
    assert_eq!((&own["model"], &own["recorded_model"]), (&Value::from("GPT2LMHeadModel"), &Value::from(true)));
    assert_eq!((&catalog["model"], &catalog["recorded_model"]), (&Value::from("gpt2"), &Value::from(false)));
    for k in ["params", "trainable_params", "mfu"] {
        assert!(own[k].is_null(), "{k}: {own}");
        assert!(!catalog[k].is_null(), "{k}: {catalog}");
    }
    let out = headroom().arg("plan").args(ours).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.starts_with("GPT2LMHeadModel (the recorded model"), "{text}");
    assert!(!text.contains("B parameters") && !text.contains("MFU"), "{text}");
    for args in [&["plan", "--gpu", "h100"][..], &["plan", "--gpu", "h100", "--infer"]] {
        headroom()
            .args(args)
            .assert()
            .code(2)
            .stderr(contains("give --model (a preset such as llama-3-8b"))
            .stderr(contains("or --program FILE to plan a step you recorded"));
    }
}

/// The allocator settings of a `--recommend` row, as flags.
fn allocator_flags(label: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in label.split(' ') {
        if let Some(conf) = word.strip_prefix("PYTORCH_CUDA_ALLOC_CONF=") {
            out.extend(["--alloc-conf".to_string(), conf.to_string()]);
        } else if word != "PyTorch's" && word != "defaults" {
            out.push(word.to_string());
        }
    }
    out
}

/// `--recommend` with a recording searches its levers: the allocator settings, checkpointing by
/// layers and, with laws fitted from two micro-batches, the micro-batch accumulated to the global
/// batch. Each row fits, as its own plan says; the fastest is the recorded shape, timed from its
/// kernels; what the recording fixes is named with the way to change it.
#[test]
fn recommend_searches_a_recordings_levers() {
    let rec = recording("gpt2-bf16-b4-s1024.jsonl");
    let base = ["--gpu", "l4", "--gpu-memory", "6GiB", "--program", &rec];
    let (code, v) = plan(&[&base[..], &["--recommend"]].concat());
    assert_eq!(code, 1, "the job asked for does not fit in 6 GiB");
    let rows = v["recommendations"].as_array().unwrap();
    assert!(rows.len() >= 3, "{v}");
    assert!(v["record_again"].as_array().is_some_and(|r| r.len() == 5), "{v}");
    for r in rows {
        assert_eq!((r["micro_batch"].as_u64(), r["accumulation"].as_u64()), (Some(4), Some(1)), "{r}");
        let mut again: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        again.extend(allocator_flags(r["allocator"].as_str().unwrap()));
        again.extend(["--checkpoint".to_string(), r["checkpoint"].as_str().unwrap().to_string()]);
        let again: Vec<&str> = again.iter().map(String::as_str).collect();
        let (code, p) = plan(&again);
        assert_eq!((code, &p["per_gpu_bytes"]), (0, &r["per_gpu_bytes"]), "{again:?}");
    }
    // Under PyTorch's defaults the step needs more than 6 GiB; expandable segments fit it
    // without checkpointing, and that row, timed from the kernels, comes first.
    assert_eq!(rows[0]["checkpoint"], "none", "{v}");
    assert_ne!(rows[0]["allocator"], "PyTorch's defaults", "{v}");
    assert!(rows[0]["step_time_s"].is_f64(), "{v}");
    assert!(rows.iter().any(|r| r["checkpoint"] == "full" && r["step_time_s"].is_null()), "{v}");

    // Three shapes: the micro-batch, accumulated to --global-batch.
    let three = [
        "--gpu",
        "l4",
        "--gpu-memory",
        "5GiB",
        "--program",
        &recording("gpt2-bf16-b2-s512.jsonl"),
        "--program",
        &recording("gpt2-bf16-b2-s1024.jsonl"),
        "--program",
        &rec,
        "--seq",
        "1024",
    ];
    let (_, v) = plan(&[&three[..], &["--batch", "4", "--global-batch", "8", "--recommend"]].concat());
    let rows = v["recommendations"].as_array().unwrap();
    assert!(!rows.is_empty(), "{v}");
    for r in rows {
        let (b, k) = (r["micro_batch"].as_u64().unwrap(), r["accumulation"].as_u64().unwrap());
        assert_eq!(b * k, 8, "{r}");
        assert!(b < 4 || r["checkpoint"] != "none", "4 × 1024 fits 5 GiB only checkpointed: {r}");
        // Accumulating keeps the gradients through the next micro-batch: the margin holds them
        // (GPT-2's 124 M bf16 gradients, 243 MiB).
        let mut again: Vec<String> = three.iter().map(|s| s.to_string()).collect();
        again.extend(allocator_flags(r["allocator"].as_str().unwrap()));
        again.extend(["--checkpoint", r["checkpoint"].as_str().unwrap(), "--batch", &b.to_string()].map(String::from));
        let (code, p) = plan(&again.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!((code, &p["per_gpu_bytes"]), (0, &r["per_gpu_bytes"]), "{again:?}");
        assert!(k == 1 || p["margin_bytes"].as_f64().unwrap() >= 243.0 * (1u64 << 20) as f64, "{p}");
    }
    assert!(rows.iter().any(|r| r["accumulation"].as_u64() > Some(1)), "{v}");
    let out = headroom().arg("plan").args(three).args(["--batch", "4", "--global-batch", "8", "--recommend"]).output();
    let text = String::from_utf8(out.unwrap().stdout).unwrap();
    assert!(text.contains("what the recording fixes — record the step again to plan another:"), "{text}");
    assert!(text.contains("a row that accumulates fits with its margin holding the gradients"), "{text}");
    // A global batch no micro-batch the recording plans reaches: refused, saying what to record.
    headroom()
        .arg("plan")
        .args(base)
        .args(["--recommend", "--global-batch", "6"])
        .assert()
        .code(2)
        .stderr(contains("--global-batch 6 is not a multiple of the 4 sequences"))
        .stderr(contains("record the step at two or three shapes"));
}

/// `--gpus N` with a recording: the recording is one rank's step, and the plan adds what the
/// recording cannot see — NCCL's buffers, outside PyTorch's allocator — naming it with its
/// bytes. The recorded kernels hold no collectives, so the step is not timed.
#[test]
fn a_recording_of_one_rank_gets_nccls_buffers() {
    let rec = recording("gpt2-bf16-b4-s1024.jsonl");
    let base = ["--gpu", "h100", "--program", &rec];
    let (_, one) = plan(&base);
    let (code, four) = plan(&[&base[..], &["--gpus", "4"]].concat());
    assert_eq!(code, 0);
    let nccl = 1.5 * (1u64 << 30) as f64;
    let per_gpu = |v: &Value| v["per_gpu_bytes"].as_f64().unwrap();
    assert_eq!(per_gpu(&four) - per_gpu(&one), nccl);
    assert_eq!(four["reserved_bytes"], one["reserved_bytes"]);
    let added = four["recording_additions"].as_array().unwrap();
    let names: Vec<&str> = added.iter().map(|a| a["what"].as_str().unwrap()).collect();
    assert!(names.iter().any(|n| n.contains("cuBLAS workspaces")), "{four}");
    let nccl_row = added.iter().find(|a| a["what"].as_str().unwrap().starts_with("NCCL's buffers")).unwrap();
    assert_eq!(
        (nccl_row["bytes"].as_f64(), nccl_row["where"].as_str()),
        (Some(nccl), Some("outside PyTorch's allocator"))
    );
    assert_eq!(one["recording_additions"].as_array().unwrap().len(), 1, "{one}");
    assert!(four["step_time_s"].is_null(), "{four}");
    let out = headroom().arg("plan").args(base).args(["--gpus", "4"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("added to the recording: NCCL's buffers over 4 GPUs, 1.50 GiB"), "{text}");
    assert!(text.contains("the recording is one rank's step"), "{text}");
}

/// An inference recording (`record --infer`, `--generate`) reads as inference: its forwards or
/// generate's prefill and decode steps, the time of its last timed forward, no training terms;
/// `--json` says `mode` `infer`. A training recording still reads as training.
#[test]
fn an_inference_recording_is_planned_as_inference() {
    let (forwards, generate) =
        (recording("gpt2-bf16-b1-s64-infer.jsonl"), recording("gpt2-bf16-b1-s64-generate2.jsonl"));
    for (rec, header, time) in [
        (
            &forwards,
            "inference: 1 sequences × 64 tokens, 2 forwards without gradients recorded in",
            "s per forward (step 2 of the recording",
        ),
        (
            &generate,
            "inference: 1 sequences × 64 tokens, generate's prefill and 2 decode steps recorded in",
            "s per decode step (step 3 of the recording",
        ),
    ] {
        let out = headroom().args(["plan", "--gpu", "l4", "--program", rec]).output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(header) && text.contains(time), "{text}");
        for training in ["training", "optimizer", "  gradients", "backward's", "MFU", "recomputing"] {
            assert!(!text.contains(training), "{training:?} in an inference plan:\n{text}");
        }
        assert!(text.contains("cuBLAS workspace (the forward's thread's)"), "{text}");
    }
    let (_, f) = plan(&["--gpu", "l4", "--program", &forwards]);
    let (_, g) = plan(&["--gpu", "l4", "--model", "gpt2", "--program", &generate]);
    for (v, steps, decode) in [(&f, 2, Value::Null), (&g, 3, Value::from(2))] {
        assert_eq!(
            (&v["mode"], &v["forwards"], &v["decode_steps"]),
            (&Value::from("infer"), &Value::from(steps), &decode)
        );
        for key in ["mfu", "accumulation", "global_batch", "finetune", "optimizer_impl", "recompute_fraction"] {
            assert!(v[key].is_null(), "{key}: {}", v[key]);
        }
        assert_eq!(v["phases"].as_object().unwrap().keys().collect::<Vec<_>>(), ["forward"]);
        assert!(v["layer_time_s"]["backward"].is_null() && v["step_time_s"].as_f64().unwrap() > 0.0);
    }
    // A forward takes in its batch's tokens; a decode step makes one a sequence.
    let per_s = |v: &Value| v["tokens_per_s"].as_f64().unwrap() * v["step_time_s"].as_f64().unwrap();
    assert!((per_s(&f) - 64.0).abs() < 1e-6 && (per_s(&g) - 1.0).abs() < 1e-9, "{} {}", per_s(&f), per_s(&g));
    let (_, train) = plan(&["--gpu", "l4", "--program", &recording("gpt2-bf16-b2-s512.jsonl")]);
    assert_eq!((&train["mode"], train.get("decode_steps")), (&Value::from("train"), None));
}

/// Training's levers are refused for an inference recording, saying why, and `--recommend`
/// searches only the allocator's settings.
#[test]
fn training_levers_are_refused_for_an_inference_recording() {
    let rec = recording("gpt2-bf16-b1-s64-infer.jsonl");
    headroom()
        .args(["plan", "--gpu", "l4", "--program", &rec, "--checkpoint", "full"])
        .assert()
        .code(2)
        .stderr(contains("is inference (its steps are forwards, without a backward): there is nothing to recompute"));
    headroom()
        .args(["plan", "--gpu", "l4", "--program", &rec, "--recommend", "--global-batch", "8"])
        .assert()
        .code(2)
        .stderr(contains("--global-batch is the sequences of an optimizer step"));
    let (code, v) = plan(&["--gpu", "l4", "--program", &rec, "--recommend"]);
    assert_eq!((code, &v["configurations_searched"]), (0, &Value::from(3)));
    for r in v["recommendations"].as_array().unwrap() {
        assert_eq!((&r["checkpoint"], &r["micro_batch"]), (&Value::from("none"), &Value::from(1)), "{r}");
    }
    // A plan that does not fit proposes no checkpointing.
    let (code, v) = plan(&["--gpu", "l4", "--gpu-memory", "700MiB", "--program", &rec]);
    assert_eq!(code, 1);
    assert!(v["levers"].as_array().unwrap().iter().all(|l| l["lever"] != "checkpointing"), "{}", v["levers"]);
}
