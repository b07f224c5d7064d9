"""Times rotor's `persistent()` (its C dynamic program through the built
`dynamic_programs` extension, then the backtracking) on rotor's benchmark
instance: a homogeneous chain of STAGES stages, forward time 1, backward 2,
activations of 5 slots, saved data of 10, no transients, a budget of SLOTS.

    python3 rotor_persistent.py ROTOR_ALGORITHMS_DIR STAGES [SLOTS]

ROTOR_ALGORITHMS_DIR is rotor's `rotor/algorithms` folder with the extension
built in place (`python setup.py build_ext --inplace` there; it needs numpy).
The folder (for the extension) and its parent are put on sys.path, and it is
imported as `algorithms`, so rotor's package `__init__` (which imports torch)
never runs. Prints the makespan and the time of the call, which is what
scripts/bench/checkpoint.sh compares.
"""
import os
import sys
import time

folder, stages = sys.argv[1], int(sys.argv[2])
slots = int(sys.argv[3]) if len(sys.argv) > 3 else 500
sys.path.insert(0, os.path.abspath(folder))  # the extension, `dynamic_programs`
sys.path.insert(0, os.path.dirname(os.path.abspath(folder)))
import algorithms  # noqa: E402

if not algorithms.persistent.__globals__["c_version_present"]:
    sys.exit("rotor's C extension is not built in " + folder)
chain = algorithms.Chain([1] * stages, [2] * stages + [0], [5] * (stages + 1), [10] * (stages + 1), [0] * stages,
                         [0] * (stages + 1))
t0 = time.perf_counter()
seq = algorithms.persistent(chain, slots)
t1 = time.perf_counter()
print(f"rotor {stages} stages x {slots} slots: makespan {seq.get_makespan(chain):g}, persistent() {t1 - t0:.3f} s")
