//! A serving engine's command line, as a launch script holds it: `vllm serve MODEL ...` (or
//! `python -m vllm.entrypoints.openai.api_server --model MODEL ...`), or `python -m
//! sglang.launch_server --model-path MODEL ...`. The first such line of the file is read;
//! `\` continuations are joined, quotes and a leading `VAR=value` are the shell's.

use super::{share, Asked, Fields, Format, ModelName, Read};
use crate::infer::WeightFormat;
use crate::names::Named;
use crate::request::{InferRequest, KvDtype, Server};
use serde_json::{Map, Value};

/// Flags that take no value, of either engine.
const SWITCHES: &[&str] = &[
    "--enforce-eager",
    "--trust-remote-code",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-auto-tool-choice",
    "--disable-cuda-graph",
    "--disable-radix-cache",
    "--enable-torch-compile",
    "--disable-custom-all-reduce",
    "--enable-expert-parallel",
    "--enable-lora",
];

/// Flags with no bearing on the memory either engine takes.
const NO_BEARING: &[&str] = &[
    "--host",
    "--port",
    "--served-model-name",
    "--api-key",
    "--trust-remote-code",
    "--tokenizer",
    "--tokenizer-path",
    "--revision",
    "--seed",
    "--random-seed",
    "--disable-log-requests",
    "--disable-log-stats",
    "--log-level",
    "--uvicorn-log-level",
    "--chat-template",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--reasoning-parser",
    "--download-dir",
    "--distributed-executor-backend",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--disable-radix-cache",
];

/// Whether `text` holds an engine's launch line.
pub(super) fn looks_like(text: &str) -> bool {
    lines(text).iter().any(|l| launch(l).is_some())
}

/// The file's logical lines: `\` continuations joined, comments dropped.
fn lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let line = raw.trim_end();
        if let Some(head) = line.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(line);
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A line split into words as the shell splits it (quotes, `#` comments).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quote, mut started) = (None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, '#') if !started => break,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            (None, c) => {
                cur.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(cur);
    }
    out
}

/// The engine a line launches and the words after its program.
fn launch(line: &str) -> Option<(Server, Vec<String>)> {
    let w = words(line);
    for i in 0..w.len() {
        let next = w.get(i + 1).map(String::as_str);
        let base = w[i].rsplit('/').next().unwrap_or("");
        let engine = match (base, next) {
            ("vllm", Some("serve")) => Server::Vllm,
            ("-m", Some("vllm.entrypoints.openai.api_server")) => Server::Vllm,
            ("-m", Some("sglang.launch_server")) => Server::Sglang,
            _ => continue,
        };
        return Some((engine, w[i + 2..].to_vec()));
    }
    None
}

/// The flags as a map from the flag (`_` written `-`) to its value (`true` for a switch); the
/// model given as vLLM's positional argument under `MODEL`.
fn flags(args: &[String]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if !a.starts_with('-') {
            if out.contains_key("MODEL") {
                return Err(format!("{a:?}: a second positional argument (the model is {:?})", out["MODEL"]));
            }
            out.insert("MODEL".into(), Value::String(a.clone()));
            continue;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let name = format!("--{}", name.trim_start_matches('-').replace('_', "-"));
        let value = match inline {
            Some(v) => Value::String(v),
            None if SWITCHES.contains(&name.as_str()) => Value::Bool(true),
            None => match args.get(i).filter(|v| !v.starts_with("--")) {
                Some(v) => {
                    i += 1;
                    Value::String(v.clone())
                }
                None => Value::Bool(true),
            },
        };
        out.insert(name, value);
    }
    Ok(out)
}

/// A token count as vLLM writes it: `2048`, `32k` (×1000), `32K` (×1024), `1m`, `1M`.
fn token_count(field: &str, s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.char_indices().last() {
        Some((at, 'k')) => (&s[..at], 1_000),
        Some((at, 'K')) => (&s[..at], 1 << 10),
        Some((at, 'm')) => (&s[..at], 1_000_000),
        Some((at, 'M')) => (&s[..at], 1 << 20),
        _ => (s, 1),
    };
    match digits.parse::<f64>() {
        Ok(x) if x > 0.0 && (x * unit as f64).fract() == 0.0 => Ok((x * unit as f64) as u64),
        _ => Err(format!("{field} {s:?}: expected a positive number of tokens")),
    }
}

fn string(f: &mut Fields, names: &[&str]) -> Result<Option<(String, String)>, String> {
    for n in names {
        if let Some(v) = f.str(n)? {
            return Ok(Some((n.to_string(), v)));
        }
    }
    Ok(None)
}

fn number(f: &mut Fields, names: &[&str]) -> Result<Option<(String, u64)>, String> {
    match string(f, names)? {
        Some((n, v)) => Ok(Some((n.clone(), token_count(&n, &v)?))),
        None => Ok(None),
    }
}

fn fraction(f: &mut Fields, name: &str) -> Result<Option<f64>, String> {
    match f.str(name)? {
        None => Ok(None),
        Some(v) => match v.parse::<f64>() {
            Ok(x) => share(name, x).map(Some),
            Err(_) => Err(format!("{name} {v:?}: expected a number")),
        },
    }
}

pub(super) fn read(text: &str) -> Result<Read, String> {
    let Some((server, args)) = lines(text).iter().find_map(|l| launch(l)) else {
        return Err("no `vllm serve` or `python -m sglang.launch_server` line".into());
    };
    let mut f = Fields::new(&Value::Object(flags(&args)?));
    let vllm = server == Server::Vllm;
    let model_flags: &[&str] = if vllm { &["MODEL", "--model"] } else { &["--model-path", "--model"] };
    let Some((field, model)) = string(&mut f, model_flags)? else {
        return Err(format!("the {} line names no model ({})", server.name(), model_flags.join(" or ")));
    };
    let field = if field == "MODEL" { "vllm serve MODEL".to_string() } else { field };
    let mut r = InferRequest { server, ..InferRequest::default() };
    let tp_flags: &[&str] =
        if vllm { &["--tensor-parallel-size", "--tp"] } else { &["--tp", "--tp-size", "--tensor-parallel-size"] };
    if let Some((_, tp)) = number(&mut f, tp_flags)? {
        r.tensor = Some(tp);
        r.gpus = tp;
    }
    for pp in ["--pipeline-parallel-size", "--pp", "--pp-size"] {
        if let Some((_, n)) = number(&mut f, &[pp])? {
            if n > 1 {
                return Err(format!("{pp} {n}: the planner plans one tensor-parallel group, no pipeline stages"));
            }
        }
    }
    let seq_flag = if vllm { "--max-model-len" } else { "--context-length" };
    if let Some((_, seq)) = number(&mut f, &[seq_flag])? {
        r.seq = seq;
    }
    r.weights = weights(&mut f)?;
    r.kv_dtype = kv_dtype(&mut f)?;
    if vllm {
        r.gpu_memory_utilization = fraction(&mut f, "--gpu-memory-utilization")?;
        r.max_num_seqs = number(&mut f, &["--max-num-seqs"])?.map(|n| n.1);
        r.max_num_batched_tokens = number(&mut f, &["--max-num-batched-tokens"])?.map(|n| n.1);
        r.block_size = number(&mut f, &["--block-size"])?.map(|n| n.1);
    } else {
        r.mem_fraction_static = fraction(&mut f, "--mem-fraction-static")?;
    }
    for flag in ["--data-parallel-size", "--dp", "--dp-size"] {
        f.not_honoured(flag, "each data-parallel replica is planned alone: this plan is one of them");
    }
    for flag in ["--enforce-eager", "--disable-cuda-graph", "--cuda-graph-max-bs", "--cpu-offload-gb", "--swap-space"] {
        f.not_honoured(flag, "not modelled: the plan is the engine's default for it");
    }
    for flag in ["--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens", "--page-size"] {
        f.not_honoured(flag, "SGLang's scheduler limits: the planner plans its defaults");
    }
    let reader = if vllm { "vLLM" } else { "SGLang" };
    Ok(Read {
        format: Format::Serve,
        model: Some(ModelName { name: model, field }),
        asked: Asked::Infer(r),
        ignored: f.finish(NO_BEARING, reader),
    })
}

fn weights(f: &mut Fields) -> Result<WeightFormat, String> {
    let mut w = match f.str("--dtype")?.as_deref() {
        None | Some("auto" | "bfloat16" | "bf16" | "half" | "float16" | "fp16") => WeightFormat::Bf16,
        Some("float32" | "float" | "fp32") => WeightFormat::Fp32,
        Some(other) => return Err(format!("--dtype {other:?}: not auto, bfloat16, float16 or float32")),
    };
    if let Some(q) = f.str("--quantization")? {
        match q.as_str() {
            "fp8" => w = WeightFormat::Fp8,
            "awq" | "awq_marlin" | "gptq" | "gptq_marlin" => {
                w = WeightFormat::Int4;
                f.ignore(format!("--quantization {q}"), "planned as 4-bit weights (--weights int4)");
            }
            other => f.ignore(format!("--quantization {other}"), "a quantization the planner does not model"),
        }
    }
    Ok(w)
}

fn kv_dtype(f: &mut Fields) -> Result<Option<KvDtype>, String> {
    Ok(match f.str("--kv-cache-dtype")?.as_deref() {
        None | Some("auto") => None,
        Some("fp8" | "fp8_e4m3" | "fp8_e5m2") => Some(KvDtype::Fp8),
        Some("bfloat16" | "bf16" | "float16" | "half") => Some(KvDtype::Bf16),
        Some(other) => return Err(format!("--kv-cache-dtype {other:?}: not auto, fp8 or a 16-bit type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = include_str!("../../../../data/configs/vllm-serve-mistral-7b.sh");

    fn infer(text: &str) -> (InferRequest, Read) {
        let read = read(text).unwrap();
        (*read.infer().unwrap_or_else(|| panic!("{:?}", read.asked)), read)
    }

    #[test]
    fn vllm_s_documented_line_reads_as_its_job() {
        let (r, read) = infer(FILE);
        assert_eq!(read.model.unwrap().name, "mistralai/Mistral-7B-v0.1");
        assert_eq!((r.server, r.seq, r.gpus), (Server::Vllm, 2048, 1));
        assert!(read.ignored.is_empty());
    }

    #[test]
    fn engine_flags_are_read_and_the_rest_named() {
        let line = "CUDA_VISIBLE_DEVICES=0,1 vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 \\\n  \
                    --max-model-len 32k --gpu-memory-utilization=0.85 --max-num-seqs 64 --kv-cache-dtype fp8 \\\n  \
                    --enforce-eager --port 8000 --swap-space 4 --speculative-config '{\"x\": 1}'\n";
        let (r, read) = infer(line);
        assert_eq!((r.tensor, r.gpus, r.seq), (Some(2), 2, 32_000));
        assert_eq!((r.gpu_memory_utilization, r.max_num_seqs, r.kv_dtype), (Some(0.85), Some(64), Some(KvDtype::Fp8)));
        let why = |f: &str| read.ignored.iter().find(|i| i.field == f).map(|i| i.why.clone()).unwrap();
        assert!(why("--enforce-eager").contains("not modelled"));
        assert_eq!(why("--port"), super::super::NO_BEARING);
        assert!(why("--speculative-config").contains("not read"));
    }

    #[test]
    fn sglang_s_line_is_an_sglang_job() {
        let line = "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --tp 4 \
                    --context-length 8192 --mem-fraction-static 0.8 --port 30000";
        let (r, read) = infer(line);
        assert_eq!(read.model.unwrap().field, "--model-path");
        assert_eq!((r.server, r.tensor, r.seq, r.mem_fraction_static), (Server::Sglang, Some(4), 8192, Some(0.8)));
    }

    #[test]
    fn bad_values_are_refused_by_flag() {
        assert!(read("vllm serve gpt2 --gpu-memory-utilization 1.5").unwrap_err().contains("--gpu-memory-utilization"));
        assert!(read("vllm serve gpt2 --pipeline-parallel-size 2").unwrap_err().contains("--pipeline-parallel-size"));
        assert!(read("vllm serve --port 1").unwrap_err().contains("names no model"));
        assert!(!looks_like("echo hello"));
    }
}
