"""stratasim.cluster and stratasim.cluster_trace against `stratasim cluster` and `stratasim
cluster-trace generate`: the module must compute what the CLI computes (expected values are the
binary's --out files).

Run by ctest with Debian's /usr/bin/python3 (PYTHONPATH, STRATASIM_CLI and STRATASIM_SOURCE_DIR as
for test_module.py). Every test writes into its own tempfile.TemporaryDirectory().
"""

import csv
import json
import os
import subprocess
import tempfile
import unittest

import stratasim

CLI = os.environ.get("STRATASIM_CLI", "stratasim")
SOURCE = os.environ.get("STRATASIM_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
PHILLY = os.path.join(SOURCE, "configs", "cluster", "philly-64.json")


def run_cli(*args):
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"stratasim {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done


class ClusterTest(unittest.TestCase):
    def test_cluster_gives_the_cli_results(self):
        with tempfile.TemporaryDirectory() as tmp:
            for policy in ("tiresias", "ones"):
                out = os.path.join(tmp, policy)
                run_cli("cluster", PHILLY, "--trace-format", "philly", "--cluster", "dgx-a100-8",
                        "--scheduler", policy, "--seed", "1", "--out", out)
                result = stratasim.cluster(PHILLY, "dgx-a100-8", scheduler=policy,
                                           trace_format="philly", seed=1, frame=False)
                with open(os.path.join(out, "summary.json")) as f:
                    self.assertEqual(result["summary"], json.load(f))
                with open(os.path.join(out, "jobs.csv")) as f:
                    rows = list(csv.DictReader(f))
                self.assertEqual(len(result["jobs"]), len(rows))
                for mine, theirs in zip(result["jobs"], rows):
                    self.assertEqual(mine["id"], theirs["id"])
                    self.assertAlmostEqual(mine["jct_s"], float(theirs["jct_s"]), places=6)
                with open(os.path.join(out, "timeline.json")) as f:
                    self.assertEqual(result["timeline"], json.load(f))

    def test_cluster_trace_is_the_generator(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "h.csv")
            run_cli("cluster-trace", "generate", "--format", "helios", "--jobs", "30", "--gpus",
                    "16", "--seed", "4", "--out", path)
            with open(path) as f:
                self.assertEqual(stratasim.cluster_trace("helios", jobs=30, gpus=16, seed=4),
                                 f.read())

    def test_bad_input_is_bad_input(self):
        with self.assertRaisesRegex(stratasim.BadInput, "expected fifo, srtf, tiresias"):
            stratasim.cluster(PHILLY, "dgx-a100-8", scheduler="gandiva", trace_format="philly")
        with self.assertRaisesRegex(stratasim.BadInput, "trace_format: expected jsonl"):
            stratasim.cluster(PHILLY, "dgx-a100-8", trace_format="pai")


if __name__ == "__main__":
    unittest.main()
