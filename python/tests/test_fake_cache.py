"""headroom_gpu.fake_cache: the cache keys it flattens are FakeTensorMode's own, item for item, and
PyTorch's flattening is back once the recording ends. Skipped, saying so, where torch is not
installed (pip install torch)."""

import unittest

try:
    import torch
    from torch._subclasses import fake_tensor

    from headroom_gpu import fake_cache

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = f"the fake cache's tests need torch (pip install torch): {e}"


@unittest.skipIf(MISSING, MISSING)
class FasterCacheKeys(unittest.TestCase):
    def setUp(self):
        self.mode = fake_tensor.FakeTensorMode()
        with self.mode:
            base = torch.empty(2, 3, 4, 5)
            self.tensors = [
                torch.empty(3, 4), torch.empty(3, 4).t(), torch.empty(()), torch.empty(0, 5),
                torch.empty(2, 3, 4, dtype=torch.bfloat16)[1:], base.permute(0, 2, 3, 1),
                base.to(memory_format=torch.channels_last), torch.empty(4, requires_grad=True),
                torch.empty(6, dtype=torch.complex64).conj(),
            ]

    def key(self, args):
        state = fake_tensor._CacheKeyState(self.mode.shape_env)
        out: list = []
        self.mode._prep_args_for_hash(out, args, state, [])
        return out

    def test_same_key_as_pytorch(self):
        args = (self.tensors, 1, 2.0, True, [3, (4, 5)], {"out": self.tensors[0]}, None, torch.float32)
        pytorch = self.key(args)
        with fake_cache.faster_cache_keys():
            self.assertEqual(fake_tensor.TensorMetadata._flatten_into.__module__, "headroom_gpu.fake_cache")
            ours = self.key(args)
        self.assertEqual(ours, pytorch)
        self.assertGreater(len(ours), 100)

    def test_each_tensor_apart(self):
        # One key per tensor: a difference in one tensor's flattening is not hidden by the others.
        for t in self.tensors:
            pytorch = self.key((t,))
            with fake_cache.faster_cache_keys():
                ours = self.key((t,))
            self.assertEqual(ours, pytorch, t.shape)

    def test_restored_after(self):
        before = fake_tensor.TensorMetadata._flatten_into
        with fake_cache.faster_cache_keys():
            self.assertIsNot(fake_tensor.TensorMetadata._flatten_into, before)
        self.assertIs(fake_tensor.TensorMetadata._flatten_into, before)

    def test_symbolic_sizes_take_pytorch_walk(self):
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        mode = fake_tensor.FakeTensorMode(shape_env=ShapeEnv())
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
        t = mode.from_tensor(torch.empty(3, 4), symbolic_context=context)  # a real tensor made fake
        self.assertTrue(any(isinstance(s, torch.SymInt) for s in t.shape), t.shape)
        state = fake_tensor._CacheKeyState(mode.shape_env)
        pytorch: list = []
        mode._prep_args_for_hash(pytorch, (t,), state, [])
        state = fake_tensor._CacheKeyState(mode.shape_env)
        ours: list = []
        with fake_cache.faster_cache_keys():
            mode._prep_args_for_hash(ours, (t,), state, [])
        self.assertEqual(ours, pytorch)


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(MISSING, MISSING)
class WholeStorages(unittest.TestCase):
    """The memory-efficient attention's bias gradient is made with its last dimension padded to
    16 and sliced back (`_efficient_attention_backward`): every call's output holds the padded
    storage, as CUDA allocates it, not only the first's (a cache hit would make it anew spanning
    the slice alone)."""

    def grad_bias(self, mode):
        with mode:
            q = torch.empty(2, 4, 56, 16, device="cuda")
            bias = torch.empty(2, 4, 56, 56, device="cuda")
            out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, bias, True)
            return torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                out, q, q, q, bias, out, lse, seed, offset, 0.0, [True, True, True, True])[3]

    def test_every_call_holds_the_padded_storage(self):
        mode = fake_tensor.FakeTensorMode()
        padded = 2 * 4 * 56 * 64 * 4
        with fake_cache.whole_storages(mode):
            for _ in range(3):
                g = self.grad_bias(mode)
                self.assertEqual(g.shape, (2, 4, 56, 56))
                self.assertEqual(g.untyped_storage().nbytes(), padded)
        self.assertNotIn("_validate_output_for_cache_entry", vars(mode))

    def test_spanned_bytes(self):
        with fake_tensor.FakeTensorMode():
            base = torch.empty(2, 3, 64)
            self.assertEqual(fake_cache.spanned_bytes(base), 2 * 3 * 64 * 4)
            self.assertEqual(fake_cache.spanned_bytes(base[..., :56]), (2 * 3 * 64 - 8) * 4)
            self.assertEqual(fake_cache.spanned_bytes(torch.empty(0, 5)), 0)
