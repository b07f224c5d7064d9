"""Lists the --flags Megatron-LM's argument parser defines, one a line, for
megatron-arguments.txt. Run from a Megatron-LM checkout with PyTorch installed:

    PYTHONPATH=. python megatron-arguments.py > megatron-arguments.txt.new

(then put the header line back, naming the commit).
"""

import argparse
import typing

if not hasattr(typing, "override"):
    typing.override = lambda f: f  # Python 3.12's; Megatron-LM's code imports it

from megatron.training.arguments import add_megatron_arguments

parser = argparse.ArgumentParser(allow_abbrev=False)
add_megatron_arguments(parser)
for flag in sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")}):
    print(flag)
