//! `headroom plan --built-on-device`: a model built from its config on the GPU (transformers'
//! `from_config` under `torch.device("cuda")`) makes a tied output layer's own weight after its
//! last weight and frees it as the embeddings are tied; a model loaded (`from_pretrained`, the
//! default) and an untied one make none.

use assert_cmd::Command;

/// The program `plan` replays for the job, as `--dump-program` writes it: (size, id) of each
/// allocation.
fn program(args: &[&str]) -> Vec<(u64, String)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.jsonl");
    let out = Command::cargo_bin("headroom")
        .unwrap()
        .arg("plan")
        .args(args)
        .arg("--dump-program")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.code().unwrap() < 2, "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|op| op["op"] == "alloc")
        .map(|op| (op["size"].as_u64().unwrap(), op["id"].as_str().unwrap().to_string()))
        .collect()
}

fn job<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--model", model, "--gpu", "h200", "--precision", "bf16", "--batch", "1", "--seq", "512"];
    a.extend_from_slice(extra);
    a
}

const HEAD: &str = "the tied output layer's own weight";

#[test]
fn a_tied_model_built_on_the_device_makes_and_frees_its_heads_weight() {
    let built = program(&job("gpt2-medium", &["--built-on-device", "true"]));
    let loaded = program(&job("gpt2-medium", &["--built-on-device", "false"]));
    let default = program(&job("gpt2-medium", &[]));
    assert_eq!(default, loaded, "a model loaded by default");
    let heads: Vec<&(u64, String)> = built.iter().filter(|(_, id)| id.contains(HEAD)).collect();
    // GPT-2 medium's output layer: 50,257 × 1,024 in bf16, made in the setup.
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(heads[0].0, 50_257 * 1_024 * 2);
    assert!(heads[0].1.contains(" setup weights "), "{}", heads[0].1);
    assert!(!loaded.iter().any(|(_, id)| id.contains(HEAD)));
    // Nothing else moves: the same allocations, the head's apart.
    let rest: Vec<u64> = built.iter().filter(|(_, id)| !id.contains(HEAD)).map(|(s, _)| *s).collect();
    assert_eq!(rest, loaded.iter().map(|(s, _)| *s).collect::<Vec<_>>());
}

#[test]
fn an_untied_model_makes_none() {
    let built = program(&job("llama-3-8b", &["--built-on-device", "true"]));
    assert!(!built.iter().any(|(_, id)| id.contains(HEAD)));
    assert_eq!(built.len(), program(&job("llama-3-8b", &[])).len());
}
