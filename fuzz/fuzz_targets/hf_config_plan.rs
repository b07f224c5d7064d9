#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| headroom_fuzz::hf_config_plan(data));
