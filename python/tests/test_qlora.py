"""QLoRA recorded (headroom_gpu.qlora): each 4-bit layer stores what bitsandbytes stores, the
forward and backward dequantize as bitsandbytes' CUDA kernels do, and `headroom replay` and
`headroom plan --program` read the recording. Skipped, saying so, where torch, transformers, peft
or bitsandbytes is not installed:

    pip install torch transformers peft bitsandbytes==0.50.2
    cd python && HEADROOM_BIN=../target/debug/headroom PYTHONPATH=. python3 -m unittest tests.test_qlora
"""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_recorder import _model_dir, assert_replays_and_plans, record_command  # noqa: E402

try:
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = ("the QLoRA recorder's tests need torch, transformers, peft and bitsandbytes "
               f"(pip install torch transformers peft bitsandbytes==0.50.2): {e}")

def _bnb_bytes(out_features, in_features, quant_type="nf4", double_quant=True):
    """What bitsandbytes' own `quantize_4bit` stores for a real bf16 weight on the CPU, as QLoRA
    quantizes it (NF4, blocks of 64, double quantization, unless told otherwise): bytes by
    QuantState field."""
    import bitsandbytes.functional as F

    w = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    packed, s = F.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type=quant_type)
    size = lambda t: t.untyped_storage().nbytes()  # noqa: E731
    out = {"weight": size(packed), "absmax": size(s.absmax), "code": size(s.code)}
    if double_quant:
        out.update({"offset": size(s.offset), "absmax2": size(s.state2.absmax), "code2": size(s.state2.code)})
    return out


@unittest.skipIf(MISSING, MISSING)
class StoredBytes(unittest.TestCase):
    """The bytes a 4-bit layer keeps are bitsandbytes' own."""

    def test_formula_is_bitsandbytes_quantize_4bit(self):
        from headroom_gpu.qlora import stored_bytes

        # 1000 blocks of 64 (4 absmax blocks of 256, the last partial), an odd element count, and
        # one block.
        for out_features, in_features in ((320, 200), (7, 9), (8, 8), (4096, 64)):
            with self.subTest(shape=(out_features, in_features)):
                self.assertEqual(stored_bytes(out_features, in_features), _bnb_bytes(out_features, in_features))

    def test_fp4_and_no_double_quantization_store_bitsandbytes_bytes(self):
        """`record --qlora --base-weights fp4 / --double-quant off`: each layer keeps what
        bitsandbytes' `quantize_4bit` keeps with that setting, and the dynamic map is made only for
        double quantization."""
        import bitsandbytes as bnb

        from headroom_gpu import qlora
        from headroom_gpu.recorder import StepRecorder

        config = transformers.AutoConfig.from_pretrained(_model_dir(tempfile.mkdtemp()))
        for quant_type, double_quant in (("fp4", True), ("nf4", False), ("fp4", False)):
            meta = qlora.build(config, "sdpa", quant_type=quant_type, double_quant=double_quant)
            with StepRecorder() as rec:
                model = qlora.prepare(meta, 8, rec)
                for name, layer in model.named_modules():
                    if not isinstance(layer, bnb.nn.Linear4bit):
                        continue
                    self.assertEqual(layer.quant_state.quant_type, quant_type)
                    tensors = [layer.weight] + qlora.state_tensors(layer.quant_state)
                    got = sum(rec._storages.get(t.untyped_storage()).size for t in tensors)
                    expected = _bnb_bytes(layer.out_features, layer.in_features, quant_type, double_quant)
                    self.assertEqual(got, sum(expected.values()), (name, quant_type, double_quant))
                    self.assertEqual(got, sum(qlora.stored_bytes(layer.out_features, layer.in_features,
                                                                double_quant).values()))
                maps = [r for op, r in rec.events if op == "alloc" and r.site == "bitsandbytes"]
                self.assertEqual(len(maps), 1 if double_quant else 0, (quant_type, double_quant))
        with self.assertRaises(ValueError):
            qlora.build(config, "sdpa", quant_type="int4")

    def test_a_tied_output_layer_stays_the_embedding(self):
        """transformers ties the output layer's weight to the embedding's again after loading:
        one tensor, which `prepare_model_for_kbit_training` casts to fp32 once."""
        from headroom_gpu import qlora

        model = qlora.build(transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000), "sdpa")
        self.assertIs(model.lm_head.weight, model.transformer.wte.weight)
        qlora.load(model)
        self.assertIs(model.lm_head.weight, model.transformer.wte.weight)
        self.assertFalse(model.lm_head.weight.is_meta)

    def test_recorded_layers_store_bitsandbytes_bytes(self):
        import bitsandbytes as bnb

        from headroom_gpu import qlora
        from headroom_gpu.recorder import StepRecorder

        config = transformers.AutoConfig.from_pretrained(_model_dir(tempfile.mkdtemp()))
        meta = qlora.build(config, "sdpa")
        with StepRecorder() as rec:
            model = qlora.prepare(meta, 8, rec)
            layers = [(n, m) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
            # 7 projections a layer, 2 layers; the output layer is not quantized.
            self.assertEqual(len(layers), 14)
            self.assertNotIn("lm_head", " ".join(n for n, _ in layers))
            for name, layer in layers:
                tensors = [layer.weight] + qlora.state_tensors(layer.quant_state)
                recorded = [rec._storages.get(t.untyped_storage()) for t in tensors]
                self.assertNotIn(None, recorded, name)
                expected = _bnb_bytes(layer.out_features, layer.in_features)
                self.assertEqual(sum(r.size for r in recorded), sum(expected.values()), name)
                self.assertEqual(recorded[0].size, expected["weight"], name)
                self.assertEqual({r.term for r in recorded[1:]}, {"weights"}, name)
                self.assertEqual(layer.weight.dtype, torch.uint8)
                self.assertFalse(layer.weight.requires_grad)
            # peft's setup: every other parameter in fp32, the adapters trainable in fp32.
            trainable = [p for p in model.parameters() if p.requires_grad]
            self.assertEqual(len(trainable), 14 * 2)
            self.assertTrue(all(p.dtype == torch.float32 for p in trainable))
            for p in model.parameters():
                self.assertIn(p.dtype, (torch.uint8, torch.float32))


@unittest.skipIf(MISSING, MISSING)
class Step(unittest.TestCase):
    """The step: the 4-bit matmul dequantizes into the compute dtype, the recording replays."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_forward_and_backward_dequantize_each_layer_in_bf16(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # 2 × 1024 = 2048 rows: past 1536, where bitsandbytes' CUDA gemm_4bit always dequantizes.
        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=1024, steps=2, qlora=8))
        self.assertEqual([a for a in rec.assumptions if "gemm_4bit" in a], [])
        def sizes(phase, site):
            return [r.size for op, r in rec.events
                    if op == "alloc" and r.when == f"step2.{phase}" and r.site.endswith(site)]

        # q_proj: the 64×64 weight dequantized in bf16 (8,192 B) after its 64 blocks' absmax in
        # fp32 (256 B, then 256 B more with the offset added).
        forward = sizes("forward", "layers.0.self_attn.q_proj.base_layer")
        self.assertEqual(forward.count(64 * 64 * 2), 1, forward)
        self.assertEqual(forward.count(64 * 4), 2, forward)
        self.assertEqual(sizes("forward", "layers.1.mlp.gate_proj.base_layer").count(128 * 64 * 2), 1)
        # The backward dequantizes each of the 6 MLP layers' weights for the input's gradient
        # (MatMul4Bit's backward), and checkpointing's recomputation of the forward once more
        # (under the autograd node whose saved tensor asked for it).
        self.assertEqual(sizes("backward", "MatMul4BitBackward").count(128 * 64 * 2), 2 * 3)
        self.assertEqual(sizes("backward", "").count(128 * 64 * 2), 2 * 2 * 3)

    def test_fp32_compute_dequantizes_each_layer_in_fp32(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # bnb_4bit_compute_dtype=torch.float32: q_proj's 64×64 weight dequantized in fp32
        # (16,384 B), none in bf16; the base's fp32 attention on SDPA's math path (grouped heads).
        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=1024, steps=2, qlora=8, dtype="fp32"))
        forward = [r.size for op, r in rec.events if op == "alloc" and r.when == "step2.forward"
                   and r.site.endswith("layers.0.self_attn.q_proj.base_layer")]
        self.assertEqual(forward.count(64 * 64 * 4), 1, forward)
        self.assertEqual(forward.count(64 * 64 * 2), 0, forward)
        self.assertEqual(set(rec.sdpa_kernels), {"math"})

    def test_amp_computes_in_bf16_and_attends_in_bf16_under_autocast(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # Trainer(bf16=True) over QLoRA: the same bf16 dequantization, and SDPA's fp32 inputs cast
        # to bf16 by CUDA's autocast, so the fused flash kernel where QLoRA outside autocast takes
        # the math path (grouped heads in fp32); the recomputation under the forward's autocast.
        spec = dict(model=_model_dir(self.tmp), batch=2, seq=1024, steps=1, qlora=8)
        amp = record(StepSpec(**spec, dtype="amp"))
        self.assertEqual(amp.sdpa_kernels, {"flash": 4})
        self.assertEqual(record(StepSpec(**spec)).sdpa_kernels, {"math": 4})
        forward = [r.size for op, r in amp.events if op == "alloc" and r.when == "step1.forward"
                   and r.site.endswith("layers.0.self_attn.q_proj.base_layer")]
        self.assertEqual(forward.count(64 * 64 * 2), 1, forward)

    def test_amp_adapters_output_is_left_to_autocast_as_on_a_gpu(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # peft's 4-bit LoRA layer casts its adapters' bf16 output back to fp32 unless
        # `torch.is_autocast_enabled()` (CUDA's) says autocast is on, which on a GPU it is:
        # no fp32 copy of the adapters' output (2 × 1024 × 64 × 4 B for q_proj) in the forward.
        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=1024, steps=1, qlora=8, dtype="amp",
                              qlora_checkpoint=False))
        copies = [r.size for op, r in rec.events if op == "alloc" and r.when == "step1.forward"
                  and r.site.endswith("layers.0.self_attn.q_proj") and r.size == 2 * 1024 * 64 * 4]
        # peft's clone of the base layer's output and its sum with the adapters': two, where a
        # third would be the adapters' output copied to fp32.
        self.assertEqual(len(copies), 2, copies)

    def test_without_checkpointing_the_backward_recomputes_nothing(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # prepare_model_for_kbit_training(use_gradient_checkpointing=False): the backward
        # dequantizes each of the 6 MLP layers' weights once, for the input's gradient, with no
        # recomputed forward's dequantization beside it.
        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=1024, steps=2, qlora=8,
                              qlora_checkpoint=False))
        backward = [r.size for op, r in rec.events if op == "alloc" and r.when == "step2.backward"]
        self.assertEqual(backward.count(128 * 64 * 2), 2 * 3)

    def test_no_checkpoint_is_for_qlora_alone(self):
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        for flags, says in ((["--no-checkpoint"], "without --qlora"),
                            (["--qlora", "8", "--no-checkpoint", "--checkpoint"], "choose one")):
            r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", _model_dir(self.tmp),
                                *flags, "--out", os.path.join(self.tmp, "x.jsonl")],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)

    def test_few_rows_say_what_is_assumed(self):
        from headroom_gpu.transformers_step import StepSpec, record

        rec = record(StepSpec(model=_model_dir(self.tmp), batch=1, seq=64, steps=1, qlora=4))
        self.assertTrue(any("gemm_4bit: 64 rows" in a for a in rec.assumptions), rec.assumptions)

    def test_setup_holds_the_4bit_base_and_peft_fp32_rest(self):
        from headroom_gpu.qlora import stored_bytes
        from headroom_gpu.transformers_step import StepSpec, record

        qlora = record(StepSpec(model=_model_dir(self.tmp), batch=1, seq=64, steps=1, qlora=8))
        layers = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)] * 2
        quantized = sum(sum(stored_bytes(o, i).values()) for o, i in layers)
        # Setup ends holding the 4-bit layers, the fp32 rest (embeddings, norms, output layer),
        # the fp32 adapters, bitsandbytes' one dynamic map and the batch's token ids.
        h, v, r = 64, 256, 8
        fp32_rest = (2 * v * h + 2 * 2 * h + h) * 4
        adapters = sum(r * (o + i) for o, i in layers) * 4
        kept_bytes = 0  # live when the first step begins
        for op, rec in qlora.events:
            if op == "alloc" and rec.when != "setup":
                break
            kept_bytes += rec.size if op == "alloc" else -rec.size
        self.assertEqual(kept_bytes, quantized + fp32_rest + adapters + 256 * 4 + _rotary_bytes(h // 4)
                         + 64 * 8)

    def test_query_and_value_targets_adapt_those_projections_alone(self):
        from headroom_gpu.transformers_step import StepSpec, record

        def setup_bytes(targets):
            rec = record(StepSpec(model=_model_dir(self.tmp), batch=1, seq=64, steps=1, qlora=8,
                                  lora_targets=targets))
            kept = 0
            for op, r in rec.events:
                if op == "alloc" and r.when != "setup":
                    return kept
                kept += r.size if op == "alloc" else -r.size

        # The same 4-bit base: the setups differ by the fp32 adapters of every linear layer but
        # the query (64 x 64) and value (32 x 64) projections, in each of the 2 layers.
        r = 8
        others = [(32, 64), (64, 64), (128, 64), (128, 64), (64, 128)]
        self.assertEqual(setup_bytes("all") - setup_bytes("qv"), 2 * sum(r * (o + i) for o, i in others) * 4)

    def test_lora_targets_without_adapters_or_with_fsdp_are_refused(self):
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        for flags, says in ((["--lora-targets", "qv"], "give one of them"),
                            (["--qlora", "8", "--fsdp", "2", "--lora-targets", "qv"], "fsdp_qlora")):
            r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", _model_dir(self.tmp),
                                *flags, "--out", os.path.join(self.tmp, "x.jsonl")],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)

    def test_record_command_replays_and_plans(self):
        out = os.path.join(self.tmp, "qlora.jsonl")
        r = record_command(self, _model_dir(self.tmp), out, "--batch", "2", "--seq", "1024", "--steps", "2",
                           "--qlora", "8")
        self.assertIn("recorded 2 steps", r.stdout)
        assert_replays_and_plans(self, out)

    def test_build_inside_the_recorder_says_where_it_belongs(self):
        from headroom_gpu import qlora
        from headroom_gpu.recorder import StepRecorder

        config = transformers.AutoConfig.from_pretrained(_model_dir(self.tmp))
        with StepRecorder(), self.assertRaisesRegex(RuntimeError, "before entering the StepRecorder"):
            qlora.build(config, "sdpa")

    def test_precisions_qlora_does_not_record_are_refused(self):
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        for flags, says in ((["--qlora", "8", "--dtype", "fp16"], "--dtype amp"),
                            (["--qlora", "8", "--fsdp", "2", "--dtype", "fp32"], "fsdp_qlora")):
            r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", _model_dir(self.tmp),
                                *flags, "--out", os.path.join(self.tmp, "x.jsonl")],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)

    def test_qlora_with_lora_is_refused(self):
        env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", _model_dir(self.tmp),
                            "--qlora", "8", "--lora", "8", "--out", os.path.join(self.tmp, "x.jsonl")],
                           capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not both", r.stderr)


TINY_BERT = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
TINY_T5 = {"model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
           "vocab_size": 256, "feed_forward_proj": "relu", "decoder_start_token_id": 0, "pad_token_id": 0}


@unittest.skipIf(MISSING, MISSING)
class Heads(unittest.TestCase):
    """BERT is recorded as a masked LM in a plain PeftModel (peft has no task type for one), T5 as
    a sequence-to-sequence LM (SEQ_2_SEQ_LM) whose `wo` stays a full fp32 layer, as transformers'
    bitsandbytes quantizer keeps it (`_keep_in_fp32_modules`); `record --qlora` records both."""

    def prepared(self, fields, attention):
        from headroom_gpu import qlora
        from headroom_gpu.recorder import StepRecorder

        fields = dict(fields)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        meta = qlora.build(config, attention)
        with StepRecorder(fake=True) as rec:
            model = qlora.prepare(meta, 4, rec)
        return model

    def test_bert_is_a_masked_lm_in_a_plain_peft_model(self):
        import bitsandbytes as bnb

        model = self.prepared(TINY_BERT, "sdpa")
        self.assertIs(type(model), peft.PeftModel)
        base = model.get_base_model()
        self.assertIsInstance(base, transformers.BertForMaskedLM)
        # The masked-LM head's transform is a linear layer like the others: 4-bit, adapted.
        self.assertIsInstance(base.cls.predictions.transform.dense.base_layer, bnb.nn.Linear4bit)
        self.assertNotIsInstance(base.cls.predictions.decoder, bnb.nn.Linear4bit)

    def test_t5_is_a_seq2seq_lm_with_its_wo_in_fp32(self):
        import bitsandbytes as bnb

        model = self.prepared(TINY_T5, "eager")
        self.assertIsInstance(model, peft.PeftModelForSeq2SeqLM)
        block = model.get_base_model().decoder.block[0]
        self.assertIsInstance(block.layer[1].EncDecAttention.q.base_layer, bnb.nn.Linear4bit)
        wo = block.layer[2].DenseReluDense.wo.base_layer
        self.assertIs(type(wo), torch.nn.Linear)
        self.assertEqual(wo.weight.dtype, torch.float32)

    def test_t5_v1_1_keeps_an_output_layer_of_its_own(self):
        """T5 v1.1's config (flan-t5's, T0's) says `tie_word_embeddings: false`: its output layer
        is a weight of its own, as loading its checkpoint leaves it, cast to fp32 beside the
        embeddings; v1.0's stays the embedding."""
        untied = self.prepared(dict(TINY_T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False), "eager")
        base = untied.get_base_model()
        self.assertIsNot(base.lm_head.weight, base.shared.weight)
        self.assertEqual(base.lm_head.weight.dtype, torch.float32)
        self.assertFalse(base.lm_head.weight.requires_grad)
        tied = self.prepared(TINY_T5, "eager").get_base_model()
        self.assertIs(tied.lm_head.weight, tied.shared.weight)

    def test_record_command_records_bert_and_t5(self):
        import json

        for name, fields, attention in (("bert", TINY_BERT, "sdpa"), ("t5", TINY_T5, "eager")):
            d = os.path.join(tempfile.mkdtemp(), name)
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(fields, f)
            out = os.path.join(d, "qlora.jsonl")
            r = record_command(self, d, out, "--batch", "2", "--seq", "32", "--steps", "2", "--qlora", "4",
                               "--attention", attention)
            self.assertIn("recorded 2 steps", r.stdout)
            assert_replays_and_plans(self, out)


def _packed_shard_bytes(out_features, in_features, world):
    """Rank 0's shard of a 4-bit weight stored as bf16 (`bnb_4bit_quant_storage=bfloat16`): the
    `ceil(out·in / 2)` packed bytes as a (bytes / 2, 1) bf16 tensor, split on dim 0."""
    return -(-(out_features * in_features // 4) // world) * 2


def _rows_bytes(rows, cols, world, itemsize):
    """Rank 0's shard of a `rows × cols` parameter FSDP2 shards on dim 0."""
    return -(-rows // world) * cols * itemsize


FSDP_WORLD = 2
# The tiny Llama's linear layers (out, in), by name.
TINY_LINEAR = {"q_proj": (64, 64), "k_proj": (32, 64), "v_proj": (32, 64), "o_proj": (64, 64),
               "gate_proj": (128, 64), "up_proj": (128, 64), "down_proj": (64, 128)}


def _layer_shard_bytes(rank, world):
    """Rank 0's shards of one tiny Llama layer under fsdp_qlora's setup: the packed bf16 weights,
    the two bf16 norms, and fp32 LoRA of `rank` over fsdp_qlora's six projections."""
    from headroom_gpu.qlora import FSDP_QLORA_TARGETS

    packed = sum(_packed_shard_bytes(o, i, world) for o, i in TINY_LINEAR.values())
    norms = 2 * _rows_bytes(64, 1, world, 2)
    adapters = sum(_rows_bytes(rank, i, world, 4) + _rows_bytes(o, rank, world, 4)
                   for name, (o, i) in TINY_LINEAR.items() if name in FSDP_QLORA_TARGETS)
    return packed + norms + adapters


@unittest.skipIf(MISSING, MISSING)
class Fsdp(unittest.TestCase):
    """`--qlora RANK --fsdp GPUS`: Answer.AI's fsdp_qlora setup on FSDP2, one rank recorded over a
    fake process group. Each packed weight is stored as bf16 and sharded; its QuantState stays
    whole on every rank; each layer is all-gathered (the packed weights with the adapters and
    norms) before bitsandbytes dequantizes it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_setup_keeps_each_packed_weights_shard_and_the_whole_quant_state(self):
        from headroom_gpu.qlora import stored_bytes
        from headroom_gpu.transformers_step import StepSpec, record

        rank = 5  # an odd rank: each adapter's dim 0 padded to the shards' size
        rec = record(StepSpec(model=_model_dir(self.tmp), batch=1, seq=64, steps=1, qlora=rank, fsdp=FSDP_WORLD))
        kept = 0  # live when the first step begins
        for op, r in rec.events:
            if op == "alloc" and r.when != "setup":
                break
            kept += r.size if op == "alloc" else -r.size
        h, v = 64, 256
        quant_states = 2 * sum(sum(b for k, b in stored_bytes(o, i).items() if k != "weight")
                               for o, i in TINY_LINEAR.values())
        # The embedding and the output layer (bf16, sharded) and the final norm; rotary's inverse
        # frequencies (a buffer: not sharded); bitsandbytes' dynamic map; the batch's token ids.
        rest = 2 * _rows_bytes(v, h, FSDP_WORLD, 2) + _rows_bytes(h, 1, FSDP_WORLD, 2)
        self.assertEqual(kept, 2 * _layer_shard_bytes(rank, FSDP_WORLD) + quant_states + rest
                         + _rotary_bytes(h // 4) + 256 * 4 + 64 * 8)

    def test_forward_gathers_each_layers_packed_bf16_weights_then_dequantizes(self):
        import bitsandbytes as bnb

        from torch.distributed.tensor import DTensor

        from headroom_gpu import qlora
        from headroom_gpu.fsdp import fake_process_group
        from headroom_gpu.recorder import StepRecorder

        config = transformers.AutoConfig.from_pretrained(_model_dir(self.tmp))
        config.use_cache = False
        meta = qlora.build(config, "sdpa", quant_storage=torch.bfloat16)
        seen = {}
        with fake_process_group(FSDP_WORLD) as mesh, StepRecorder() as rec:
            model = qlora.prepare_sharded(meta, 8, mesh, rec)
            layer = model.base_model.model.model.layers[0]
            q = layer.self_attn.q_proj.base_layer
            self.assertIsInstance(q, bnb.nn.Linear4bit)
            # The shard of the packed weight; the QuantState whole, the module's.
            self.assertEqual(tuple(q.weight.to_local().shape), (64 * 64 // 4 // FSDP_WORLD, 1))
            self.assertEqual(q.weight.dtype, torch.bfloat16)
            self.assertEqual(tuple(q.quant_state.absmax.shape), (64 * 64 // 64,))

            def gathered(module, args):
                w = module.weight
                seen.setdefault("weight", (w.dtype, tuple(w.shape), isinstance(w, DTensor)))
                r = rec._storages[w.untyped_storage()]
                seen.setdefault("buffers", []).append((r.when, r.size, r.index))

            q.register_forward_pre_hook(gathered)
            ids = torch.randint(0, config.vocab_size, (2, 1024))
            with qlora.cuda_kernels(rec), rec.step():
                model(input_ids=ids, labels=ids).loss.backward()
        # The layer's unsharded packed weight, bf16, copied out of its all-gather's output (every
        # rank's shards of the layer's parameters, as bytes: their dtypes differ) into a buffer
        # of its own, padded shards of every rank.
        self.assertEqual(seen["weight"], (torch.bfloat16, (64 * 64 // 4, 1), False))
        # Freed after the layer's forward (reshard_after_forward) and made again for checkpointing's
        # recomputation in the backward.
        unsharded = FSDP_WORLD * _packed_shard_bytes(64, 64, FSDP_WORLD)
        self.assertEqual([(when, size) for when, size, _ in seen["buffers"]],
                         [("step1.forward", unsharded), ("step1.backward", unsharded)])
        self.assertEqual(len({index for _, _, index in seen["buffers"]}), 2)
        allocs = [r for op, r in rec.events if op == "alloc"]
        gather = FSDP_WORLD * _layer_shard_bytes(8, FSDP_WORLD)
        layer0 = [r.size for r in allocs if r.when == "step1.forward" and r.site.endswith("layers.0")]
        self.assertIn(gather, layer0)
        # Then bitsandbytes dequantizes it into a bf16 temporary (2048 rows: past 1536).
        forward = [r.size for r in allocs
                   if r.when == "step1.forward" and r.site.endswith("layers.0.self_attn.q_proj.base_layer")]
        self.assertEqual(forward.count(64 * 64 * 2), 1, forward)
        # Resharded after the forward, the layer is gathered again for its backward.
        backward = [r.size for r in allocs if r.when == "step1.backward"]
        self.assertGreaterEqual(backward.count(gather), 1)

    def test_adamw8bit_over_dtensors_is_refused_saying_why(self):
        from headroom_gpu.transformers_step import StepSpec, record

        with self.assertRaisesRegex(ValueError, "DTensor sharding rule"):
            record(StepSpec(model=_model_dir(self.tmp), steps=1, qlora=8, fsdp=FSDP_WORLD, optimizer="adamw-8bit"))

    def test_record_command_replays_and_plans(self):
        out = os.path.join(self.tmp, "fsdp-qlora.jsonl")
        r = record_command(self, _model_dir(self.tmp), out, "--batch", "2", "--seq", "1024", "--steps", "2",
                           "--qlora", "8", "--fsdp", str(FSDP_WORLD))
        self.assertIn("recorded 2 steps", r.stdout)
        # One rank of two: the plan adds NCCL's buffers.
        assert_replays_and_plans(self, out, "--gpus", str(FSDP_WORLD))


@unittest.skipIf(MISSING, MISSING)
class AdamW8bit(unittest.TestCase):
    """`--optimizer adamw-8bit`: bitsandbytes' AdamW8bit keeps its state by its rules."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_formula_is_adamw8bit_on_real_tensors(self):
        import bitsandbytes as bnb

        from headroom_gpu.qlora import adamw_8bit_state_bytes

        # Under min_8bit_size (fp32 moments), at it, a partial block of 256, several.
        params = [torch.nn.Parameter(torch.randn(n)) for n in (3000, 4096, 5000, 70000)]
        opt = bnb.optim.AdamW8bit(params, lr=1e-3)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        for p in params:
            state = {k: v for k, v in opt.state[p].items() if torch.is_tensor(v) and not k.startswith("qmap")}
            self.assertEqual(adamw_8bit_state_bytes(p.numel()),
                             sum(v.untyped_storage().nbytes() for v in state.values()), p.numel())

    def test_recorded_state_is_adamw8bit(self):
        from headroom_gpu.qlora import adamw_8bit_state_bytes
        from headroom_gpu.transformers_step import StepSpec, record

        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=2, optimizer="adamw-8bit"))
        recorded = sum(r.size for op, r in rec.events if op == "alloc" and r.term == "optimizer")
        config = transformers.AutoConfig.from_pretrained(_model_dir(self.tmp))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        expected = sum(adamw_8bit_state_bytes(p.numel()) for p in model.parameters())
        # and the two 256-entry fp32 maps every parameter's state shares.
        self.assertEqual(recorded, expected + 2 * 256 * 4)
        # torch's AdamW keeps more: two moments of the parameter's dtype (bf16) a parameter.
        full = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=2))
        self.assertLess(recorded, sum(r.size for op, r in full.events if op == "alloc" and r.term == "optimizer"))

    def test_qlora_with_adamw8bit_replays(self):
        out = os.path.join(self.tmp, "qlora-8bit.jsonl")
        record_command(self, _model_dir(self.tmp), out, "--batch", "1", "--seq", "64", "--steps", "2",
                       "--qlora", "8", "--optimizer", "adamw-8bit")
        assert_replays_and_plans(self, out)

@unittest.skipIf(MISSING, MISSING)
class Documented(unittest.TestCase):
    """docs/RECORDING.md's QLoRA commands run as shown. They sit in `shell` blocks, apart from the
    `sh` blocks tests/test_recorder.py runs, because they need bitsandbytes. The FSDP one is
    planned as the text says (`headroom plan ... --program` of its output, shown inline), and
    prints the lines its `text` block shows."""

    def test_the_commands(self):
        import re

        from test_recorder import _documented, headroom_or_skip

        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(repo, "docs", "RECORDING.md"), encoding="utf-8") as f:
            text = f.read()
        commands = [l for b in _documented("shell") for l in b if l.startswith("python -m headroom_gpu ")]
        self.assertEqual(len(commands), 4)
        self.assertTrue(all("--qlora" in c for c in commands))
        self.assertEqual(sum("--double-quant off" in c for c in commands), 1)
        self.assertEqual(sum("--dtype amp" in c for c in commands), 1)
        self.assertEqual(sum("--fsdp" in c for c in commands), 1)
        d = tempfile.mkdtemp()
        os.symlink(os.path.join(repo, "data"), os.path.join(d, "data"))
        env = {**os.environ, "PYTHONPATH": os.path.join(repo, "python")}
        for line in commands:
            args = line.split()[1:]
            run = subprocess.run([sys.executable, *args], cwd=d, capture_output=True, text=True, env=env,
                                 timeout=1500)
            self.assertEqual(run.returncode, 0, run.stderr)
            out = args[args.index("--out") + 1]
            self.assertGreater(os.path.getsize(os.path.join(d, out)), 0)
            if "--fsdp" not in args:
                continue
            # The plan the text shows (inline code, wrapped over lines), of this recording.
            inline = [" ".join(m.split()) for m in re.findall(r"`(headroom plan [^`]*)`", text)]
            plans = [m for m in inline if m.endswith(f"--program {out}")]
            self.assertEqual(len(plans), 1, inline)
            binary = headroom_or_skip(self)
            plan = subprocess.run([binary, *plans[0].split()[1:]], cwd=d, capture_output=True, text=True,
                                  timeout=300)
            self.assertEqual(plan.returncode, 0, plan.stdout + plan.stderr)
            printed = [l.rstrip() for l in plan.stdout.splitlines()]
            shown = _documented("text")
            self.assertEqual(len(shown), 1)
            for want in shown[0]:
                self.assertIn(want.rstrip(), printed, plan.stdout)


@unittest.skipIf(MISSING, MISSING)
class Targets(unittest.TestCase):
    """`record --lora-targets qv` wraps what the recorded `lora-qv` and `qlora-qv` steps wrap."""

    def test_query_and_value_targets_are_the_recorded_steps(self):
        from headroom_gpu import qlora

        step_programs = _step_programs()
        self.assertEqual(qlora.QV_TARGETS, step_programs.QV_TARGETS)
        llama = transformers.LlamaConfig()
        self.assertEqual(qlora.target_modules(llama, "all"), "all-linear")
        self.assertIsNone(qlora.target_modules(llama, "qv"))  # peft's default: q_proj, v_proj
        self.assertEqual(qlora.target_modules(transformers.Phi3Config(), "qv"), ["qkv_proj"])
        with self.assertRaisesRegex(ValueError, "one of all, qv"):
            qlora.target_modules(llama, "mlp")


def _step_programs():
    """scripts/validate/step_programs.py, the recorder the templates come from."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(repo, "scripts", "validate"))
    try:
        import step_programs
    finally:
        sys.path.pop(0)
    return step_programs


def _rotary_bytes(head_dim):
    """Llama's rotary embedding keeps its inverse frequencies, and their original: head_dim / 2
    fp32 each."""
    return 2 * head_dim // 2 * 4



@unittest.skipIf(MISSING, MISSING)
class StateLaws(unittest.TestCase):
    """The QLoRA recorder reads a quantized weight's bitsandbytes state as a fraction of that
    weight's elements, even where its bytes at the recording are also a width's."""

    def setUp(self):
        step_programs = _step_programs()
        self.sp = step_programs
        self.qp = step_programs.qlora_programs()
        # The grouped recording's widths: 12 heads of 80 over 4, a hidden size of 768.
        self.d = {"h": 768, "q": 960, "kv": 320, "f": 2048, "heads": 12, "kv_heads": 4, "d": 80}
        shapes = [(960, 768), (320, 768), (320, 768), (768, 960), (2048, 768), (2048, 768), (768, 2048)]
        self.fractions = [(a * b, *reversed(step_programs.shape_units((a, b), self.d))) for a, b in shapes]
        # The weights as parameters, and the query's fp32 bias: 4 q bytes, as large as a key
        # projection's 8-bit absmax (320 x 768 / 64 = 3,840).
        self.params = self.fractions + [(960, "q", 1), (320, "kv", 1)]

    def law(self, n, weight):
        return self.qp.fixed_law(n, self.params, self.fractions, self.d, "tensor", self.sp.widths_of("bf16"), (),
                                 weight)

    def test_a_weights_absmax_is_its_fraction_not_a_width(self):
        key = self.fractions[1]
        self.assertEqual(self.law(3840, None), {"fixed": {"q": 4.0}})  # by bytes alone: the bias's reading
        self.assertEqual(self.law(3840, key), {"fixed": {"kv*h": 1 / 64}})
        # Double quantization's fp32 absmax of the absmax: one element a 256 blocks of 64.
        self.assertEqual(self.law(60, key), {"fixed": {"kv*h": 1 / 4096}})
        # The dynamic map the nested state quantizes with: a constant.
        self.assertEqual(self.law(1024, key), {"fixed": {"one": 1024.0}})

    def test_state_no_fraction_of_its_weight_explains_is_refused(self):
        with self.assertRaisesRegex(self.sp.Unexplained, "no fraction of its elements"):
            self.law(3000, self.fractions[1])


if __name__ == "__main__":
    unittest.main()
