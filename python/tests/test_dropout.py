"""Dropout recorded as CUDA runs it (headroom_gpu.dropout): where CUDA's `aten::dropout` runs the
fused `native_dropout`, which keeps a one-byte bool mask, the recorder's CPU tensors keep the same
mask, not the CPU's noise in the input's dtype, in `python -m headroom_gpu record`'s steps, QLoRA's
included. Skipped, saying so, where torch or transformers is not installed:

    pip install torch transformers peft bitsandbytes==0.50.2
    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_dropout.py
"""

import json
import os
import tempfile
import unittest

try:
    import torch
    import transformers  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = f"the dropout tests need torch and transformers (pip install torch transformers): {e}"

# A GPT-2 of two layers 64 wide, with GPT-2's dropout (0.1 after the embeddings, after each
# block's attention and after its MLP).
TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
             "n_positions": 128, "vocab_size": 256, "bos_token_id": 0, "eos_token_id": 0, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "attn_pdrop": 0.1}
BATCH, SEQ = 2, 32


def _made(rec, since):
    """The bytes of each storage the recording made after its first `since` events."""
    return [r.size for op, r in rec.events[since:] if op == "alloc"]


@unittest.skipIf(MISSING, MISSING)
class AsCudaRunsIt(unittest.TestCase):
    """`F.dropout` on the recorder's CPU tensors makes what it makes on fake CUDA tensors, where
    PyTorch's own `aten::dropout` picks the kernel by device: at every rate, in training and in
    eval, in place or not, in bf16 and fp32."""

    def test_each_call_makes_what_it_makes_on_cuda(self):
        from headroom_gpu.recorder import StepRecorder

        F = torch.nn.functional
        with StepRecorder(kernels=False) as rec:
            for dtype in (torch.bfloat16, torch.float32):
                for p in (0.0, 0.1, 1.0):
                    for train in (True, False):
                        for inplace in (False, True):
                            made = {}
                            for device in ("cuda", "cpu"):
                                x = torch.empty(BATCH, SEQ, 64, dtype=dtype, device=device)
                                since = len(rec.events)
                                F.dropout(x, p, train, inplace)
                                made[device] = _made(rec, since)
                            with self.subTest(dtype=dtype, p=p, train=train, inplace=inplace):
                                self.assertEqual(made["cpu"], made["cuda"])
        # The fused case itself: the output in the input's dtype, the mask one byte an element.
        with StepRecorder(kernels=False) as rec:
            x = torch.empty(BATCH, SEQ, 64, dtype=torch.bfloat16)
            since = len(rec.events)
            F.dropout(x, 0.1, True)
        self.assertEqual(_made(rec, since), [2 * BATCH * SEQ * 64, BATCH * SEQ * 64])

    def test_the_backward_is_cudas_and_the_cpus_dropout_comes_back(self):
        """CUDA's backward inside the recorder; the CPU's after it, and inside one made with
        `cuda_dropout=False` (the templates' recorders)."""
        from headroom_gpu.recorder import StepRecorder

        def backward():
            x = torch.empty(8, 8, requires_grad=True)
            return type(torch.nn.functional.dropout(x, 0.5, True).grad_fn).__name__

        with StepRecorder(kernels=False):
            self.assertEqual(backward(), "NativeDropoutBackward0")
        self.assertEqual(backward(), "MulBackward0")
        with StepRecorder(kernels=False, cuda_dropout=False):
            self.assertEqual(backward(), "MulBackward0")


@unittest.skipIf(MISSING, MISSING)
class RecordedSteps(unittest.TestCase):
    """`record`'s steps keep, at each of GPT-2's dropouts, its output and a one-byte mask."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        os.makedirs(os.path.join(self.tmp, "gpt2"))
        self.model = os.path.join(self.tmp, "gpt2")
        with open(os.path.join(self.model, "config.json"), "w") as f:
            json.dump(TINY_GPT2, f)

    def dropped(self, rec):
        """The sizes of the storages the steady step's forward made at each dropout module."""
        at = {}
        for op, r in rec.events:
            if op == "alloc" and r.when == "step2.forward" and r.site.rsplit(".", 1)[-1] in ("drop", "resid_dropout",
                                                                                              "dropout"):
                at.setdefault(r.site, []).append(r.size)
        return at

    def check(self, rec, width):
        n = BATCH * SEQ * 64
        at = self.dropped(rec)
        # The embeddings' and two a block.
        self.assertEqual(len(at), 1 + 2 * TINY_GPT2["n_layer"], at)
        for site, sizes in at.items():
            self.assertEqual(sizes, [width * n, n], site)

    def test_record_keeps_one_byte_masks_in_bf16_and_fp32(self):
        from headroom_gpu.transformers_step import StepSpec, record

        for dtype, width in (("bf16", 2), ("fp32", 4)):
            with self.subTest(dtype=dtype):
                self.check(record(StepSpec(model=self.model, batch=BATCH, seq=SEQ, steps=2, dtype=dtype)), width)

    def test_fake_and_real_tensors_keep_the_same_masks(self):
        from headroom_gpu.transformers_step import StepSpec, record

        s = StepSpec(model=self.model, batch=BATCH, seq=SEQ, steps=2)
        fake, real = record(s, fake=True, route_sdpa=False), record(s, fake=False, route_sdpa=False)
        self.assertEqual(fake.peak, real.peak)
        self.assertEqual(self.dropped(fake), self.dropped(real))

    def test_record_qlora_keeps_one_byte_masks(self):
        """QLoRA's activations between the 4-bit layers are fp32 (prepare_model_for_kbit_training's
        casts): each dropout's output is fp32, its mask one byte an element."""
        try:
            import bitsandbytes  # noqa: F401
            import peft  # noqa: F401
        except ImportError as e:
            self.skipTest(f"record --qlora needs peft and bitsandbytes: {e}")
        from headroom_gpu.transformers_step import StepSpec, record

        self.check(record(StepSpec(model=self.model, batch=BATCH, seq=SEQ, steps=2, qlora=4)), 4)


if __name__ == "__main__":
    unittest.main()
