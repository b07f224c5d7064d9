//! Every preset pinned: its parameter count and every field of its model, as the presets were
//! before they became config files (the counts are Hugging Face's published ones), so a preset
//! file or a change to the reader that moves any of them fails here.

use headroom_catalog::model::{preset, presets, Family, Family::*, Model};

/// name, parameters, family, `model_type`, [hidden, layers, heads, key-value heads, head
/// dimension, MLP width, vocabulary, positions, experts, experts a token, decoder layers,
/// relative-position buckets], which of (tied embeddings, QKV bias, gated MLP) it has, window.
type Row<'a> = (&'a str, u64, Family, &'static str, [u64; 12], &'a str, Option<u64>);

#[rustfmt::skip]
const PINNED: [Row<'static>; 30] = [
    ("gpt2", 124_439_808, Gpt2, "gpt2", [768, 12, 12, 12, 64, 3072, 50257, 1024, 1, 1, 12, 0], "tied bias", None),
    ("gpt2-medium", 354_823_168, Gpt2, "gpt2", [1024, 24, 16, 16, 64, 4096, 50257, 1024, 1, 1, 24, 0], "tied bias", None),
    ("gpt2-large", 774_030_080, Gpt2, "gpt2", [1280, 36, 20, 20, 64, 5120, 50257, 1024, 1, 1, 36, 0], "tied bias", None),
    ("gpt2-xl", 1_557_611_200, Gpt2, "gpt2", [1600, 48, 25, 25, 64, 6400, 50257, 1024, 1, 1, 48, 0], "tied bias", None),
    ("llama-2-7b", 6_738_415_616, GatedDecoder, "llama", [4096, 32, 32, 32, 128, 11008, 32000, 4096, 1, 1, 32, 0], "gated", None),
    ("llama-2-13b", 13_015_864_320, GatedDecoder, "llama", [5120, 40, 40, 40, 128, 13824, 32000, 4096, 1, 1, 40, 0], "gated", None),
    ("llama-2-70b", 68_976_648_192, GatedDecoder, "llama", [8192, 80, 64, 8, 128, 28672, 32000, 4096, 1, 1, 80, 0], "gated", None),
    ("llama-3-8b", 8_030_261_248, GatedDecoder, "llama", [4096, 32, 32, 8, 128, 14336, 128256, 8192, 1, 1, 32, 0], "gated", None),
    ("llama-3.1-8b", 8_030_261_248, GatedDecoder, "llama", [4096, 32, 32, 8, 128, 14336, 128256, 131072, 1, 1, 32, 0], "gated", None),
    ("llama-3-70b", 70_553_706_496, GatedDecoder, "llama", [8192, 80, 64, 8, 128, 28672, 128256, 8192, 1, 1, 80, 0], "gated", None),
    ("llama-3.1-70b", 70_553_706_496, GatedDecoder, "llama", [8192, 80, 64, 8, 128, 28672, 128256, 131072, 1, 1, 80, 0], "gated", None),
    ("llama-3.1-405b", 405_853_388_800, GatedDecoder, "llama", [16384, 126, 128, 8, 128, 53248, 128256, 131072, 1, 1, 126, 0], "gated", None),
    ("mistral-7b", 7_241_732_096, GatedDecoder, "mistral", [4096, 32, 32, 8, 128, 14336, 32000, 32768, 1, 1, 32, 0], "gated", Some(4096)),
    ("mixtral-8x7b", 46_702_792_704, GatedDecoder, "mixtral", [4096, 32, 32, 8, 128, 14336, 32000, 32768, 8, 2, 32, 0], "gated", None),
    ("qwen2.5-7b", 7_615_616_512, GatedDecoder, "qwen2", [3584, 28, 28, 4, 128, 18944, 152064, 32768, 1, 1, 28, 0], "bias gated", None),
    ("phi-3-mini", 3_821_079_552, GatedDecoder, "phi3", [3072, 32, 32, 32, 96, 8192, 32064, 4096, 1, 1, 32, 0], "gated", None),
    ("gemma-2b", 2_506_172_416, GatedDecoder, "gemma", [2048, 18, 8, 1, 256, 16384, 256000, 8192, 1, 1, 18, 0], "tied gated", None),
    ("gemma-7b", 8_537_680_896, GatedDecoder, "gemma", [3072, 28, 16, 16, 256, 24576, 256000, 8192, 1, 1, 28, 0], "tied gated", None),
    ("pythia-160m", 162_322_944, NeoX, "gpt_neox", [768, 12, 12, 12, 64, 3072, 50304, 2048, 1, 1, 12, 0], "bias", None),
    ("pythia-1b", 1_011_781_632, NeoX, "gpt_neox", [2048, 16, 8, 8, 256, 8192, 50304, 2048, 1, 1, 16, 0], "bias", None),
    ("pythia-6.9b", 6_857_302_016, NeoX, "gpt_neox", [4096, 32, 32, 32, 128, 16384, 50432, 2048, 1, 1, 32, 0], "bias", None),
    ("bloom-7b1", 7_069_016_064, Bloom, "bloom", [4096, 30, 32, 32, 128, 16384, 250880, 2048, 1, 1, 30, 0], "tied bias", None),
    ("bert-base-uncased", 109_482_240, Bert, "bert", [768, 12, 12, 12, 64, 3072, 30522, 512, 1, 1, 0, 0], "tied bias", None),
    ("bert-base-cased", 108_310_272, Bert, "bert", [768, 12, 12, 12, 64, 3072, 28996, 512, 1, 1, 0, 0], "tied bias", None),
    ("bert-large-uncased", 335_141_888, Bert, "bert", [1024, 24, 16, 16, 64, 4096, 30522, 512, 1, 1, 0, 0], "tied bias", None),
    ("t5-base", 222_903_552, T5, "t5", [768, 24, 12, 12, 64, 3072, 32128, 512, 1, 1, 12, 32], "tied", None),
    ("t5-large", 737_668_096, T5, "t5", [1024, 48, 16, 16, 64, 4096, 32128, 512, 1, 1, 24, 32], "tied", None),
    ("t5-3b", 2_851_598_336, T5, "t5", [1024, 48, 32, 32, 128, 16384, 32128, 512, 1, 1, 24, 32], "tied", None),
    ("t0-3b", 2_849_757_184, T5, "t5", [2048, 48, 32, 32, 64, 5120, 32128, 512, 1, 1, 24, 32], "gated", None),
    // mT0 is mT5, as its config.json says: the one field the files changed. transformers runs
    // it with T5's code, and the planner's recipes and programs take mT5 for T5.
    ("mt0-xxl", 12_921_057_280, T5, "mt5", [4096, 48, 64, 64, 64, 10240, 250112, 512, 1, 1, 24, 32], "gated", None),
];

fn check(m: &Model, want: Row) {
    let flags = [("tied", m.tied_embeddings), ("bias", m.qkv_bias), ("gated", m.gated_mlp)];
    let flags = flags.iter().filter(|f| f.1).map(|f| f.0).collect::<Vec<_>>().join(" ");
    let dims = [
        m.hidden,
        m.layers,
        m.heads,
        m.kv_heads,
        m.head_dim,
        m.intermediate,
        m.vocab,
        m.max_position,
        m.experts,
        m.experts_per_token,
        m.decoder_layers,
        m.relative_buckets,
    ];
    let got: Row = (&m.name, m.params(), m.family, m.model_type, dims, &flags, m.sliding_window);
    assert_eq!(got, want, "{}", want.0);
    // Mistral slides on every layer; no other preset has a window.
    assert!(m.global_layers.is_empty() && (0..m.decoder_layers).all(|l| m.slides(l) == m.sliding_window.is_some()));
}

#[test]
fn every_preset_keeps_its_parameters_and_shape() {
    let all = presets();
    let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
    let pinned: Vec<&str> = PINNED.iter().map(|r| r.0).collect();
    assert_eq!(names, pinned, "the presets, in the order errors and docs list them");
    for want in PINNED {
        check(&preset(want.0).unwrap(), want);
    }
}

/// The directory holds the presets and nothing else, and its README says where each came from.
#[test]
fn every_preset_file_is_a_preset_with_its_source() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/models/presets");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|f| f.strip_suffix(".json").map(str::to_string))
        .collect();
    files.sort();
    let mut names: Vec<String> = presets().iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(files, names, "data/models/presets/*.json against the embedded table");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for name in names {
        let row = format!("| `{name}.json` | [");
        assert!(readme.contains(&row), "README.md names no source for {name}.json");
    }
}
