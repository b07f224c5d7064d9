"""`headroom plan --emit deepspeed|accelerate|fsdp|torchtitan|megatron`, read by the engines'
own loaders: DeepSpeed's `DeepSpeedConfig` (which checks the batch sizes against the world size),
transformers' `HfArgumentParser(TrainingArguments)` (the `torchrun` line's arguments),
Accelerate's `load_config_from_file` (which refuses keys it does not know), torchtitan's
`ConfigManager` (which refuses fields its job config lacks) and Megatron-LM's argument parser
and `validate_args` (from a Megatron-LM checkout named by $MEGATRON_LM, which pip does not
install). Each test skips, saying so,
where its engine is not installed. Run as the other tests are (see test_headroom_gpu.py):

    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest tests.test_engine_configs -v
"""

import contextlib
import importlib.util
import io
import json
import os
import shlex
import sys
import typing
import tempfile
import unittest
import warnings
from unittest import mock

import headroom_gpu


def emitted(engine, model="llama-3-8b", **options):
    """The configuration `headroom plan --emit engine` writes for Llama 3 8B on H100s."""
    plan = headroom_gpu.plan(model=model, gpu="h100-sxm", emit=engine, **options)
    text = plan["engine_config"]
    if not text:
        raise AssertionError(f"--emit {engine} wrote nothing: {plan}")
    return text


def installed(package):
    return importlib.util.find_spec(package) is not None


@unittest.skipUnless(installed("deepspeed"), "deepspeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
class DeepSpeed(unittest.TestCase):
    def load(self, text, world_size):
        """DeepSpeed's own reading of a `ds_config.json` file, as one of `world_size` ranks."""
        from deepspeed.runtime import config as ds_config

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ds_config.json")
            with open(path, "w") as f:
                f.write(text)
            # No process group here: the ranks DeepSpeed would ask torch.distributed for.
            with warnings.catch_warnings(), mock.patch.object(
                ds_config.dist, "get_rank", return_value=0
            ), mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size):
                # DeepSpeed leaves the file it reads open.
                warnings.simplefilter("ignore", ResourceWarning)
                return ds_config.DeepSpeedConfig(path)

    def test_zero_3_with_checkpointing_on_8_gpus(self):
        text = emitted("deepspeed", gpus=8, zero=3, batch=2, accumulation=4, checkpoint="full")
        cfg = self.load(text, 8)
        self.assertEqual(cfg.zero_optimization_stage, 3)
        self.assertEqual(cfg.train_micro_batch_size_per_gpu, 2)
        self.assertEqual(cfg.gradient_accumulation_steps, 4)
        self.assertEqual(cfg.train_batch_size, 64)
        self.assertTrue(cfg.bfloat16_config.enabled)
        self.assertFalse(cfg.activation_checkpointing_config.partition_activations)
        self.assertEqual(cfg.gradient_clipping, 1.0)

    def test_the_optimizer_offloaded(self):
        text = emitted("deepspeed", gpus=4, zero=2, offload="optimizer")
        cfg = self.load(text, 4)
        self.assertEqual(cfg.zero_optimization_stage, 2)
        self.assertEqual(cfg.zero_config.offload_optimizer.device, "cpu")
        self.assertEqual(json.loads(text)["train_batch_size"], cfg.train_batch_size)

    def test_a_world_size_the_config_was_not_planned_for_is_refused(self):
        """The check the two tests above pass is a real one."""
        text = emitted("deepspeed", gpus=8, zero=3, batch=2, accumulation=4)
        with self.assertRaises(AssertionError):
            self.load(text, 16)


@unittest.skipUnless(installed("accelerate"), "accelerate is not installed (pip install accelerate)")
class Accelerate(unittest.TestCase):
    def setUp(self):
        global DistributedType
        from accelerate.utils import DistributedType

    def load(self, text):
        """Accelerate's own reading of a config file (`accelerate launch --config_file`)."""
        from accelerate.commands.config.config_args import load_config_from_file

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "accelerate.yaml")
            with open(path, "w") as f:
                f.write(text)
            return load_config_from_file(path)

    def test_deepspeed_under_accelerate(self):
        cfg = self.load(emitted("accelerate", gpus=16, zero=3, offload="params", accumulation=4))
        self.assertEqual(cfg.distributed_type, DistributedType.DEEPSPEED)
        self.assertEqual((cfg.num_machines, cfg.num_processes), (2, 16))
        self.assertEqual(cfg.mixed_precision, "bf16")
        self.assertEqual(cfg.deepspeed_config["zero_stage"], 3)
        self.assertEqual(cfg.deepspeed_config["offload_param_device"], "cpu")
        self.assertEqual(cfg.deepspeed_config["gradient_accumulation_steps"], 4)

    def test_plain_data_parallel(self):
        cfg = self.load(emitted("accelerate", gpus=8, zero=0, batch=1))
        self.assertEqual(cfg.distributed_type, DistributedType.MULTI_GPU)
        self.assertEqual(cfg.num_processes, 8)


@unittest.skipUnless(installed("transformers"), "transformers is not installed (pip install transformers)")
class TrainerFsdp(unittest.TestCase):
    def parse(self, text):
        """transformers' own reading of the `torchrun ... train.py` line's arguments: the
        `TrainingArguments` a script built on `HfArgumentParser` gets."""
        from transformers import HfArgumentParser, TrainingArguments

        words = shlex.split(text.replace("\\\n", " "))
        args = words[words.index("train.py") + 1 :]
        from transformers import training_args

        # The arguments are checked as on the H100s they were planned for: bf16 is there.
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
            training_args, "is_torch_bf16_gpu_available", return_value=True
        ):
            (parsed,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
                args + ["--output_dir", tmp], look_for_args_file=False
            )
        return words, parsed

    def test_sharded_with_accumulation_and_checkpointing(self):
        words, a = self.parse(emitted("fsdp", gpus=8, zero=3, accumulation=4, checkpoint="full"))
        self.assertEqual(words[: words.index("train.py")][:3], ["torchrun", "--nproc_per_node", "8"])
        if isinstance(a.fsdp, bool):
            # transformers 5 reads the string form (deprecated there) as FSDP on, its sharding in
            # fsdp_config: full_shard reshards after the forward.
            self.assertTrue(a.fsdp)
            self.assertTrue(a.fsdp_config["reshard_after_forward"])
        else:
            self.assertIn("full_shard", " ".join(str(x) for x in a.fsdp))
        self.assertEqual((a.per_device_train_batch_size, a.gradient_accumulation_steps), (1, 4))
        self.assertTrue(a.gradient_checkpointing)
        self.assertTrue(a.bf16)


def reads_job_files():
    """Whether torchtitan's ConfigManager reads TOML job files (0.2; 0.3 builds configs in Python)."""
    if not installed("torchtitan"):
        return False
    from torchtitan.config import manager

    return hasattr(manager.ConfigManager, "_maybe_load_toml")


@unittest.skipUnless(
    reads_job_files(),
    "torchtitan with TOML job files is not installed (pip install torchtitan==0.2.2; 0.3 has none)",
)
class Torchtitan(unittest.TestCase):
    def load(self, text):
        """torchtitan's own reading of a job file (`--job.config_file`)."""
        from torchtitan.config.manager import ConfigManager

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "job.toml")
            with open(path, "w") as f:
                f.write(text)
            return ConfigManager().parse_args(["--job.config_file", path])

    def test_fsdp_with_accumulation_and_per_op_checkpointing(self):
        text = emitted(
            "torchtitan", "llama-3.1-8b", framework="torchtitan", gpus=8, batch=2, accumulation=4, checkpoint="per-op"
        )
        cfg = self.load(text)
        self.assertEqual((cfg.model.name, cfg.model.flavor), ("llama3", "8B"))
        self.assertEqual((cfg.training.local_batch_size, cfg.training.global_batch_size), (2, 64))
        self.assertEqual(cfg.parallelism.data_parallel_shard_degree, 8)
        self.assertEqual((cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option), ("selective", "op"))

    def test_tensor_and_interleaved_pipeline_parallelism_in_float8(self):
        text = emitted(
            "torchtitan",
            "llama-3.1-70b",
            framework="torchtitan",
            gpus=64,
            tp=8,
            pp=2,
            accumulation=8,
            precision="fp8",
            pp_schedule="interleaved-1f1b",
            checkpoint="full",
            compile=True,
        )
        cfg = self.load(text)
        p = cfg.parallelism
        self.assertEqual((p.tensor_parallel_degree, p.pipeline_parallel_degree, p.data_parallel_shard_degree), (8, 2, 4))
        self.assertEqual((p.pipeline_parallel_schedule, p.pipeline_parallel_microbatch_size), ("Interleaved1F1B", 1))
        self.assertEqual(cfg.training.local_batch_size, 8)
        self.assertEqual(cfg.model.converters, ["quantize.linear.float8"])
        self.assertTrue(cfg.compile.enable)


MEGATRON_LM = os.environ.get("MEGATRON_LM")


@unittest.skipUnless(
    MEGATRON_LM and os.path.isfile(os.path.join(MEGATRON_LM, "megatron", "training", "arguments.py")),
    "MEGATRON_LM does not name a Megatron-LM checkout (git clone https://github.com/NVIDIA/Megatron-LM)",
)
class Megatron(unittest.TestCase):
    def validate(self, text, world_size):
        """Megatron-LM's parsing and checking of `pretrain_gpt.py`'s arguments, as on a Hopper GPU."""
        if MEGATRON_LM not in sys.path:
            sys.path.insert(0, MEGATRON_LM)
        # Megatron-LM's code imports Python 3.12's typing.override.
        typing.override = getattr(typing, "override", lambda f: f)
        import argparse

        import megatron.training.arguments as megatron_args
        import torch

        command, script = text.replace("\\\n", " ").split("pretrain_gpt.py", 1)
        env = dict(w.split("=", 1) for w in shlex.split(command) if "=" in w)
        parser = argparse.ArgumentParser(allow_abbrev=False)
        megatron_args.add_megatron_arguments(parser)
        args = parser.parse_args(shlex.split(script))
        args.rank, args.world_size = 0, world_size
        with mock.patch.dict(os.environ, env), mock.patch.object(
            megatron_args, "get_device_arch_version", return_value=9
        ), mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)), contextlib.redirect_stdout(
            io.StringIO()
        ):
            megatron_args.validate_args(args)
        return args

    def test_each_model_s_arguments_pass_megatron_s_checks(self):
        jobs = {
            "llama-3.1-8b": dict(tp=2, pp=2, precision="fp8", checkpoint="selective", offload="optimizer"),
            "mistral-7b": dict(tp=2, pp=2, checkpoint="full", vpp=2),
            "qwen2.5-7b": dict(tp=2, pp=2),
            "mixtral-8x7b": dict(pp=2, cp=2, checkpoint="every-2"),
            "gpt2": dict(tp=1, seq=1024),
        }
        for model, options in jobs.items():
            with self.subTest(model=model):
                options = {"gpus": 16, "zero": 1, "seq": 4096, **options}
                args = self.validate(emitted("megatron", model, **options), 16)
                gpt2 = model == "gpt2"
                self.assertEqual(args.normalization, "LayerNorm" if gpt2 else "RMSNorm")
                self.assertEqual(args.position_embedding_type, "learned_absolute" if gpt2 else "rope")
                self.assertEqual(args.add_bias_linear, gpt2)


if __name__ == "__main__":
    unittest.main()
