"""scripts/validate/template_file.py: the program template files, packed and as the recorders'
JSON — both forms read back as written, packing is deterministic, and the three-way merge by key
(also as git's merge driver).

    python3 -m unittest python/tests/test_template_file.py
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "validate", "template_file.py")
PROGRAMS = os.path.join(ROOT, "data", "programs")
sys.path.insert(0, os.path.dirname(SCRIPT))
import template_file as tf  # noqa: E402

HEAD = {"about": "a test", "torch": "2.15.0", "shapes": [[2, 56], [3, 56]], "layers": 5}


def data(**templates):
    return {**HEAD, "templates": templates}


def cli(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class Forms(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_both_forms_read_back_what_was_written(self):
        d = data(**{"b/x": {"laws": [{"one": 1.5}], "step1": None}, "a/y": {"error": "no step"},
                    "c/ü": {"s": "ü", "n": [1, 2.0, -3e-9]}})
        for name in ("t.tpl", "t.json"):
            tf.write(self.path(name), d)
            self.assertEqual(tf.read(self.path(name)), d, name)
            self.assertEqual(tf.keys(self.path(name)), ["a/y", "b/x", "c/ü"])
            self.assertEqual(tf.template(self.path(name), "c/ü"), d["templates"]["c/ü"])
            self.assertIsNone(tf.template(self.path(name), "d"))
        self.assertTrue(tf.is_packed(self.path("t.tpl")))
        self.assertFalse(tf.is_packed(self.path("t.json")))
        # The recorders' text: the header, then one template a line, by key.
        with open(self.path("t.json")) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[1].startswith('"a/y":'))

    def test_packing_is_deterministic_whatever_the_order_given(self):
        one = data(a={"x": 1}, b={"y": [1, 2]}, c={"z": {"k": 1, "j": 2}})
        other = data(c={"z": {"k": 1, "j": 2}}, a={"x": 1}, b={"y": [1, 2]})
        self.assertEqual(tf.pack(one), tf.pack(other))
        tf.write(self.path("a.tpl"), one)
        tf.write(self.path("b.tpl"), tf.read(self.path("a.tpl")))
        with open(self.path("a.tpl"), "rb") as a, open(self.path("b.tpl"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertNotEqual(tf.pack(one), tf.pack(data(a={"x": 2}, b={"y": [1, 2]}, c={"z": {"k": 1, "j": 2}})))

    def test_a_shipped_file_unpacks_and_packs_to_the_same_bytes(self):
        shipped = os.path.join(PROGRAMS, "hf.tpl")
        self.assertEqual(cli("unpack", shipped, self.path("hf.json")).returncode, 0)
        self.assertEqual(cli("pack", self.path("hf.json"), self.path("hf.tpl")).returncode, 0)
        with open(shipped, "rb") as a, open(self.path("hf.tpl"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        r = cli("cat", shipped)
        with open(self.path("hf.json")) as f:
            self.assertEqual(r.stdout, f.read())
        keys = cli("keys", shipped).stdout.split()
        self.assertIn("llama/causal-lm/bf16/sdpa/full", keys)
        one = json.loads(cli("cat", shipped, "llama/causal-lm/bf16/sdpa/full").stdout)
        # Recorded at 15 heads over 5 (step_programs.GQA), whose laws no element width can misread.
        self.assertEqual((one["dims"]["heads"], one["dims"]["kv_heads"]), (15, 5))
        r = cli("cat", shipped, "llama/no-such-head")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no template llama/no-such-head", r.stderr)

    def test_every_shipped_file_is_packed_and_under_2_mib(self):
        names = sorted(os.listdir(PROGRAMS))
        self.assertTrue(names)
        for name in names:
            path = os.path.join(PROGRAMS, name)
            self.assertTrue(name.endswith(".tpl") and tf.is_packed(path), name)
            self.assertLess(os.path.getsize(path), 2 << 20, name)

    def test_a_damaged_file_is_refused_with_its_reason(self):
        blob = tf.pack(data(a={"x": 1}, b={"y": 2}))
        for cut in (3, 9, 20, len(blob) - 1):
            with open(self.path("cut.tpl"), "wb") as f:
                f.write(blob[:cut])
            with self.assertRaises(tf.TemplateFileError, msg=cut):
                tf.read(self.path("cut.tpl"))
        with open(self.path("bad.tpl"), "wb") as f:
            f.write(blob[:-2] + bytes([blob[-2] ^ 0xFF, blob[-1]]))
        with self.assertRaisesRegex(tf.TemplateFileError, "the template b does not inflate"):
            tf.read(self.path("bad.tpl"))
        with open(self.path("other.json"), "w") as f:
            json.dump({"rows": []}, f)
        r = cli("keys", self.path("other.json"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("without a `templates` object", r.stderr)


class Merge(unittest.TestCase):
    BASE = data(kept={"v": 0}, ours={"v": 0}, theirs={"v": 0}, both={"v": 0}, gone={"v": 0})

    def test_each_side_s_changes_are_taken(self):
        ours = data(kept={"v": 0}, ours={"v": 1}, theirs={"v": 0}, both={"v": 3}, new_o={"v": 5})
        theirs = {**data(kept={"v": 0}, ours={"v": 0}, theirs={"v": 2}, both={"v": 3}, gone={"v": 0},
                         new_t={"v": 6}), "torch": "2.16.0"}
        merged = tf.merge(self.BASE, ours, theirs)
        self.assertEqual(merged, {**HEAD, "torch": "2.16.0", "templates": {
            "kept": {"v": 0}, "ours": {"v": 1}, "theirs": {"v": 2}, "both": {"v": 3},
            "new_o": {"v": 5}, "new_t": {"v": 6}}})

    def test_a_key_both_sides_changed_differently_is_a_conflict_named(self):
        ours = data(kept={"v": 0}, ours={"v": 0}, theirs={"v": 0}, both={"v": 1}, gone={"v": 0}, added={"v": 1})
        theirs = data(kept={"v": 0}, ours={"v": 0}, theirs={"v": 0}, both={"v": 2}, added={"v": 2})
        with self.assertRaises(tf.TemplateFileError) as e:
            tf.merge(self.BASE, ours, theirs)
        self.assertIn("both: changed on ours and changed on theirs", str(e.exception))
        self.assertIn("added: added on ours and added on theirs", str(e.exception))
        self.assertNotIn("gone", str(e.exception))
        # Deleted on one side and changed on the other.
        ours = {**self.BASE, "templates": {**self.BASE["templates"], "gone": {"v": 9}}}
        with self.assertRaisesRegex(tf.TemplateFileError, "gone: changed on ours and deleted on theirs"):
            tf.merge(self.BASE, ours, data(**{k: v for k, v in self.BASE["templates"].items() if k != "gone"}))
        # An int and a float of the same value are different templates' text.
        with self.assertRaisesRegex(tf.TemplateFileError, "kept: changed on ours and changed on theirs"):
            tf.merge(self.BASE, data(kept={"v": 1}), data(kept={"v": 1.0}))

    def test_the_command_writes_ours_form_or_nothing(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        p = lambda n: os.path.join(d, n)  # noqa: E731
        tf.write(p("base.json"), self.BASE)
        tf.write(p("ours.tpl"), data(**{**self.BASE["templates"], "ours": {"v": 1}}))
        tf.write(p("theirs.json"), data(**{**self.BASE["templates"], "theirs": {"v": 2}}))
        self.assertEqual(cli("merge", p("out"), p("base.json"), p("ours.tpl"), p("theirs.json")).returncode, 0)
        self.assertTrue(tf.is_packed(p("out")))
        self.assertEqual(tf.read(p("out"))["templates"]["theirs"], {"v": 2})
        self.assertEqual(tf.read(p("out"))["templates"]["ours"], {"v": 1})
        tf.write(p("theirs.json"), data(**{**self.BASE["templates"], "ours": {"v": 2}}))
        r = cli("merge", p("out2"), p("base.json"), p("ours.tpl"), p("theirs.json"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("ours: changed on ours and changed on theirs", r.stderr)
        self.assertFalse(os.path.exists(p("out2")))

    @unittest.skipUnless(shutil.which("git"), "git is not installed")
    def test_git_merges_two_branches_by_key_with_the_driver(self):
        repo = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, repo)

        def git(*args):
            return subprocess.run(["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", *args],
                                  capture_output=True, text=True)

        git("init", "-q", "-b", "main")
        shutil.copy(os.path.join(ROOT, ".gitattributes"), repo)
        git("config", "merge.tpl.driver", f"{sys.executable} {SCRIPT} merge %A %O %A %B")
        path = os.path.join(repo, "t.tpl")
        tf.write(path, self.BASE)
        git("add", ".")
        git("commit", "-q", "-m", "base")
        git("checkout", "-q", "-b", "other")
        tf.write(path, data(**{**self.BASE["templates"], "theirs": {"v": 2}}))
        git("commit", "-q", "-am", "theirs")
        git("checkout", "-q", "main")
        tf.write(path, data(**{**self.BASE["templates"], "ours": {"v": 1}}))
        git("commit", "-q", "-am", "ours")
        r = git("merge", "-q", "--no-edit", "other")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = tf.read(path)["templates"]
        self.assertEqual((got["ours"], got["theirs"], got["kept"]), ({"v": 1}, {"v": 2}, {"v": 0}))


if __name__ == "__main__":
    unittest.main()
