"""scripts/validate/quant_infer.py: a model of bitsandbytes' 4-bit layers loaded on the CPU with
bitsandbytes' CUDA operators' allocations (`CudaPath`) stores what `qlora.stored_bytes` says
bitsandbytes stores, layer by layer; and a forward takes the dequantize-then-matmul path over
more than 4 rows and the fused kernel's at 4 or fewer; LLM.int8()'s layers likewise; BERT's buffers
loaded as zeros, T5's `wo` kept in fp32.

    PYTHONPATH=python python3 -m unittest python/tests/test_quant_infer.py
"""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))

try:
    import bitsandbytes as bnb
    import torch
    import transformers  # noqa: F401

    import quant_infer as qi
    import step_programs as sp

    MISSING = None
except ImportError as e:
    MISSING = f"needs torch, transformers and bitsandbytes ({e})"


@unittest.skipIf(MISSING, MISSING or "")
class CudaPath(unittest.TestCase):
    def setUp(self):
        cfg = qi.config(sp.config("llama", 2), "llama", 2)
        self.model = qi.build(cfg, "causal-lm", "sdpa")
        with qi.CudaPath():
            qi.load(self.model)

    def test_each_layer_stores_what_bitsandbytes_stores(self):
        from headroom_gpu import qlora

        layers = [m for m in self.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        self.assertEqual(len(layers), 2 * 7)
        for m in layers:
            out_features, in_features = m.weight.quant_state.shape
            state = [m.weight] + qlora.state_tensors(m.weight.quant_state)
            got = sum(t.untyped_storage().nbytes() for t in state)
            self.assertEqual(got, sum(qlora.stored_bytes(out_features, in_features).values()))
            self.assertFalse(m.support_avx512bf16_for_cpu, "bitsandbytes' CPU repacking left on")

    def test_a_prompt_dequantizes_and_a_decode_step_does_not(self):
        layer = next(m for m in self.model.modules() if isinstance(m, bnb.nn.Linear4bit))
        out_features, in_features = layer.weight.quant_state.shape
        made = []

        class Seen(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if isinstance(out, torch.Tensor):
                    made.append((tuple(out.shape), out.dtype))
                return out

        for rows, dequantized in ((5, True), (4, False)):
            made.clear()
            x = torch.zeros(rows, in_features, dtype=torch.bfloat16)
            # Seen below CudaPath: it sees the operators CudaPath runs for bitsandbytes'.
            with torch.no_grad(), Seen(), qi.CudaPath():
                y = layer(x)
            self.assertEqual(tuple(y.shape), (rows, out_features))
            self.assertEqual(((out_features, in_features), torch.bfloat16) in made, dequantized, rows)



@unittest.skipIf(MISSING, MISSING or "")
class Int8(unittest.TestCase):
    """LLM.int8(): each layer keeps its int8 weight and an fp32 scale a row; a forward makes the
    int32 product of the quantized input and weight, and dequantizes it to fp16 before the cast to
    the input's dtype."""

    def setUp(self):
        cfg = qi.config(sp.config("llama", 2), "llama", 2)
        self.model = qi.build(cfg, "causal-lm", "sdpa", "int8")
        with qi.CudaPath():
            qi.load(self.model, "int8")
        # Evaluation, as the recording runs it (in training bitsandbytes takes another path on a CPU).
        self.model.eval()

    def test_each_layer_stores_its_int8_weight_and_row_scales(self):
        layers = [m for m in self.model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
        self.assertEqual(len(layers), 2 * 7)
        for m in layers:
            self.assertEqual(m.weight.dtype, torch.int8)
            self.assertEqual(m.weight.untyped_storage().nbytes(), m.out_features * m.in_features)
            self.assertEqual(m.weight.SCB.untyped_storage().nbytes(), 4 * m.out_features)

    def test_a_forward_makes_the_int32_product_and_its_fp16_dequantization(self):
        layer = next(m for m in self.model.modules() if isinstance(m, bnb.nn.Linear8bitLt))
        made = []

        class Seen(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor):
                        made.append((tuple(t.shape), t.dtype))
                return out

        rows = 6
        x = torch.zeros(rows, layer.in_features, dtype=torch.bfloat16)
        with torch.no_grad(), Seen(), qi.CudaPath():
            y = layer(x)
        self.assertEqual((tuple(y.shape), y.dtype), ((rows, layer.out_features), torch.bfloat16))
        for want in (((rows, layer.in_features), torch.int8), ((rows, layer.out_features), torch.int32),
                     ((rows, layer.out_features), torch.float16)):
            self.assertIn(want, made)


@unittest.skipIf(MISSING, MISSING or "")
class Families(unittest.TestCase):
    """What the other families' recordings need of the loading: BERT's index buffers, and T5's
    modules kept in fp32."""

    def test_a_4bit_model_loads_its_buffers_as_zeros_and_bert_runs_its_forward(self):
        cfg = qi.config(sp.config("bert", 2), "bert", 2)
        model = qi.build(cfg, "masked-lm", "sdpa")
        with qi.CudaPath():
            qi.load(model)
        model.eval()
        self.assertTrue(all(not b.any() for b in model.buffers()), "a buffer left with leftover memory")
        ids = torch.zeros(2, 8, dtype=torch.long)
        with torch.no_grad(), qi.CudaPath():
            out = model(input_ids=ids)
        self.assertEqual(tuple(out.logits.shape), (2, 8, cfg["vocab_size"]))

    def test_int8_t5_keeps_wo_a_full_linear_layer_in_fp32(self):
        cfg = qi.config(sp.config("t5", 2), "t5", 2)
        model = qi.build(cfg, "seq2seq-lm", "eager", "int8")
        with qi.CudaPath():
            qi.load(model, "int8")
        wo = [m for n, m in model.named_modules() if n.endswith(".wo")]
        self.assertTrue(wo)
        for m in wo:
            self.assertNotIsInstance(m, bnb.nn.Linear8bitLt)
            self.assertEqual(m.weight.dtype, torch.float32)
        self.assertTrue(any(isinstance(m, bnb.nn.Linear8bitLt) for m in model.modules()))


if __name__ == "__main__":
    unittest.main()
