//! The presets: the models users name on the command line, each a Hugging Face
//! `config.json` in `data/models/presets/` (the README there names the Hub repository each
//! mirrors), embedded in the binary and read by [`Model::from_hf_config`] like any user's file.

use super::{Model, ModelError};
use std::sync::OnceLock;

/// A preset's name and its `config.json`, embedded at build time.
macro_rules! preset {
    ($name:literal) => {
        ($name, include_str!(concat!("../../../../data/models/presets/", $name, ".json")))
    };
}

/// In the order errors and docs list them (research/estimation.md §7).
const FILES: [(&str, &str); 30] = [
    preset!("gpt2"),
    preset!("gpt2-medium"),
    preset!("gpt2-large"),
    preset!("gpt2-xl"),
    preset!("llama-2-7b"),
    preset!("llama-2-13b"),
    preset!("llama-2-70b"),
    preset!("llama-3-8b"),
    preset!("llama-3.1-8b"),
    preset!("llama-3-70b"),
    preset!("llama-3.1-70b"),
    preset!("llama-3.1-405b"),
    preset!("mistral-7b"),
    preset!("mixtral-8x7b"),
    preset!("qwen2.5-7b"),
    preset!("phi-3-mini"),
    preset!("gemma-2b"),
    preset!("gemma-7b"),
    preset!("pythia-160m"),
    preset!("pythia-1b"),
    preset!("pythia-6.9b"),
    preset!("bloom-7b1"),
    preset!("bert-base-uncased"),
    preset!("bert-base-cased"),
    preset!("bert-large-uncased"),
    preset!("t5-base"),
    preset!("t5-large"),
    preset!("t5-3b"),
    preset!("t0-3b"),
    preset!("mt0-xxl"),
];

/// Every preset, read once.
pub fn presets() -> &'static [Model] {
    static PRESETS: OnceLock<Vec<Model>> = OnceLock::new();
    PRESETS.get_or_init(|| {
        FILES
            .iter()
            .map(|&(name, text)| {
                Model::from_hf_config(text, name)
                    .unwrap_or_else(|e| panic!("the bundled preset {name} does not read: {e}"))
            })
            .collect()
    })
}

/// The presets' README, whose table names the Hub repository each preset mirrors.
const README: &str = include_str!("../../../../data/models/presets/README.md");

/// (Hub repository, preset) for every preset, from the README's table: the ids users type
/// (`meta-llama/Meta-Llama-3-8B`).
pub fn hub_ids() -> Vec<(&'static str, &'static str)> {
    README
        .lines()
        .filter_map(|l| {
            let file = l.strip_prefix("| `")?.split_once(".json`")?.0;
            let repo = l.split_once("| [")?.1.split_once(']')?.0;
            Some((repo, file))
        })
        .collect()
}

/// A preset by name (case, `_` and spaces ignored), or by the Hub id of the repository it
/// mirrors (case ignored; `https://huggingface.co/` before it allowed).
pub fn preset(name: &str) -> Result<Model, ModelError> {
    let n = name.to_ascii_lowercase().replace(['_', ' '], "-");
    let all = presets();
    let id = ["https://", "http://"].iter().fold(name.trim(), |s, p| s.strip_prefix(p).unwrap_or(s));
    let id = ["huggingface.co/", "hf.co/"].iter().fold(id, |s, p| s.strip_prefix(p).unwrap_or(s));
    let hub = hub_ids();
    let n = hub.iter().find(|(repo, _)| repo.eq_ignore_ascii_case(id)).map_or(n, |(_, p)| p.to_string());
    all.iter().find(|m| m.name == n).cloned().ok_or_else(|| {
        let names = all.iter().map(|m| m.name.as_str());
        let near = if id.contains('/') {
            crate::names::nearest(id, hub.iter().map(|(repo, _)| *repo))
        } else {
            crate::names::nearest(&n, names.clone())
        };
        ModelError::Unknown(
            name.to_string(),
            format!(
                "{}known presets: {}",
                crate::names::did_you_mean(&near).trim_start_matches("; ").to_string()
                    + if near.is_empty() { "" } else { " " },
                names.collect::<Vec<_>>().join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset is named by the Hub id of the repository its README row says it mirrors.
    #[test]
    fn every_preset_answers_to_its_hub_id() {
        let hub = hub_ids();
        assert_eq!(hub.len(), FILES.len());
        for (repo, name) in hub {
            assert_eq!(preset(repo).unwrap().name, name, "{repo}");
            assert_eq!(preset(&repo.to_lowercase()).unwrap().name, name, "{repo}");
            assert_eq!(preset(&format!("https://huggingface.co/{repo}")).unwrap().name, name, "{repo}");
        }
    }

    #[test]
    fn parameter_counts_equal_the_published_ones() {
        for (name, count) in [
            ("gpt2", 124_439_808u64),
            ("gpt2-medium", 354_823_168),
            ("gpt2-large", 774_030_080),
            ("gpt2-xl", 1_557_611_200),
            ("llama-2-7b", 6_738_415_616),
            ("llama-2-13b", 13_015_864_320),
            ("llama-2-70b", 68_976_648_192),
            ("llama-3-8b", 8_030_261_248),
            ("llama-3-70b", 70_553_706_496),
            // Hugging Face's meta-llama/Llama-3.1-70B and -405B.
            ("llama-3.1-70b", 70_553_706_496),
            ("llama-3.1-405b", 405_853_388_800),
            ("mistral-7b", 7_241_732_096),
            ("mixtral-8x7b", 46_702_792_704),
            ("qwen2.5-7b", 7_615_616_512),
            ("phi-3-mini", 3_821_079_552),
            ("gemma-2b", 2_506_172_416),
            ("gemma-7b", 8_537_680_896),
            // Pythia's Table 1 (with embeddings).
            ("pythia-160m", 162_322_944),
            ("pythia-1b", 1_011_781_632),
            ("pythia-6.9b", 6_857_302_016),
            ("bloom-7b1", 7_069_016_064),
            ("bert-base-uncased", 109_482_240),
            ("bert-base-cased", 108_310_272),
            ("bert-large-uncased", 335_141_888),
            ("t5-base", 222_903_552),
            // DeepSpeed's memory estimator examples: 737.67M and 2851M.
            ("t5-large", 737_668_096),
            ("t5-3b", 2_851_598_336),
        ] {
            assert_eq!(preset(name).unwrap().params(), count, "{name}");
        }
        assert_eq!(preset("mixtral-8x7b").unwrap().active_params(), 12_879_925_248);
    }
}
