"""`import stratasim` against the command line: the module must compute what the CLI computes.

Expected values come from outside the module: the `stratasim` binary (its --out files, its
printed summary, its stderr after "error: ") and the shipped experiment files.

Run by ctest with Debian's /usr/bin/python3; the environment gives
  PYTHONPATH            the build's python/ folder (the assembled stratasim package)
  STRATASIM_CLI         the stratasim binary
  STRATASIM_SOURCE_DIR  the repository (for configs/experiments)
Every test that writes files does so in its own tempfile.TemporaryDirectory().
"""

import csv
import json
import math
import os
import subprocess
import tempfile
import unittest

import stratasim

CLI = os.environ.get("STRATASIM_CLI", "stratasim")
SOURCE = os.environ.get("STRATASIM_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
SMALL = "gpt3-1.7b-a100-8"  # pure data parallelism on one DGX A100: a few ms to simulate
TINY = "gpt-tiny-3d-8"      # tp 2 x pp 2 x dp 2: every kind of parallelism, tiny


def run_cli(*args, expect=0):
    """Runs the stratasim binary; its completed process (stdout and stderr as text)."""
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != expect:
        raise AssertionError(f"stratasim {' '.join(args)}: exit {done.returncode}, expected "
                             f"{expect}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return done


def cli_error(*args):
    """What the CLI prints after "error: " for a bad input (exit code 2)."""
    stderr = run_cli(*args, expect=2).stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0][len("error: "):]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def same_cell(text, value):
    """Whether a CSV cell as the CLI wrote it and the module's parsed value agree."""
    if value is None:
        return text == ""
    if isinstance(value, bool):
        return text == ("true" if value else "false")
    if isinstance(value, (int, float)):
        return text != "" and float(text) == value
    return text == value


class Simulate(unittest.TestCase):
    def test_report_equals_the_cli_report_json(self):
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", SMALL, "--quiet", "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        r = stratasim.simulate(SMALL)
        self.assertEqual(r.report, expected)
        self.assertEqual(set(r.keys()), set(expected))
        self.assertEqual(r["iteration_time_s"], expected["iteration_time_s"])
        self.assertTrue(r.completed)
        self.assertIn(SMALL, repr(r))

    def test_iterations_equal_the_cli_iterations(self):
        # docs/parameter-server.md: --iterations 3 of a parameter-server run.
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", "vgg16-ps-v100-10", "--quiet", "--iterations", "3", "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        r = stratasim.simulate("vgg16-ps-v100-10", iterations=3)
        self.assertEqual(r.report, expected)
        self.assertEqual(r["iterations"], 3)
        self.assertEqual(len(r["iteration_end_s"]), 3)

    def test_set_overrides_equal_the_cli_set(self):
        sets = ["parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=2",
                "training.global_batch=16"]
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", SMALL, *[a for s in sets for a in ("--set", s)], "--quiet",
                    "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        self.assertEqual(stratasim.simulate(SMALL, set=sets).report, expected)
        # a dict of overrides is the same as the list
        as_dict = {"parallelism.tp": 2, "parallelism.pp": 2, "parallelism.dp": 2,
                   "training.global_batch": 16}
        self.assertEqual(stratasim.simulate(SMALL, set=as_dict).report, expected)

    def test_summary_equals_the_printed_summary(self):
        printed = run_cli("simulate", SMALL).stdout
        summary = stratasim.simulate(SMALL).summary()
        # The CLI prints the summary, then "simulated N ops (...) in T s" (a wall time).
        self.assertTrue(printed.startswith(summary), f"{summary!r}\nis not the start of\n{printed!r}")
        self.assertTrue(printed[len(summary):].startswith("simulated "), printed[len(summary):])
        self.assertIn("stratasim report: " + SMALL, summary)

    def test_write_writes_what_simulate_out_writes(self):
        with tempfile.TemporaryDirectory() as tmp:
            cli_out, py_out = os.path.join(tmp, "cli"), os.path.join(tmp, "py")
            run_cli("simulate", TINY, "--quiet", "--out", cli_out)
            stratasim.simulate(TINY).write(py_out)
            for name in ("report.json", "timeline.json", "memory.csv"):
                with open(os.path.join(cli_out, name), "rb") as a, \
                        open(os.path.join(py_out, name), "rb") as b:
                    self.assertEqual(a.read(), b.read(), name)

    def test_an_experiment_is_loaded_once_and_simulated_again(self):
        e = stratasim.load(TINY)
        self.assertEqual((e.name, e.tp, e.pp, e.dp, e.world_size), (TINY, 2, 2, 2, 8))
        self.assertEqual(stratasim.simulate(e).report, stratasim.simulate(TINY).report)
        with self.assertRaises(stratasim.BadInput):
            stratasim.load(e, set=["parallelism.tp=1"])


class Errors(unittest.TestCase):
    def assert_same_error(self, cli_args, call):
        expected = cli_error(*cli_args)
        with self.assertRaises(stratasim.BadInput) as caught:
            call()
        self.assertEqual(str(caught.exception), expected)
        self.assertIsInstance(caught.exception, ValueError)

    def test_an_unknown_set_key(self):
        self.assert_same_error(["simulate", SMALL, "--set", "parallelism.tpp=2"],
                               lambda: stratasim.simulate(SMALL, set=["parallelism.tpp=2"]))

    def test_a_bad_set_value(self):
        self.assert_same_error(["simulate", SMALL, "--set", "parallelism.tp=abc"],
                               lambda: stratasim.simulate(SMALL, set="parallelism.tp=abc"))

    def test_a_set_without_a_value(self):
        self.assert_same_error(["simulate", SMALL, "--set", "parallelism.tp"],
                               lambda: stratasim.simulate(SMALL, set=["parallelism.tp"]))

    def test_a_missing_experiment_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            missing = os.path.join(tmp, "missing.json")
            self.assert_same_error(["simulate", missing], lambda: stratasim.simulate(missing))
            self.assert_same_error(["memory", missing], lambda: stratasim.memory(missing))

    def test_a_memory_set_error(self):
        self.assert_same_error(["memory", SMALL, "--set", "training.dtype=fp4"],
                               lambda: stratasim.memory(SMALL, set=["training.dtype=fp4"]))

    def test_a_bad_dict(self):
        with self.assertRaises(stratasim.BadInput) as caught:
            stratasim.simulate({"model": "gpt3-1.7b", "cluster": "dgx-a100-1"})
        self.assertIn("<dict>", str(caught.exception))
        with self.assertRaises(stratasim.BadInput):
            stratasim.simulate({"model": "no-such-model", "cluster": "dgx-a100-1",
                                "parallelism": {}, "training": {}})

    def test_sweep_and_search_take_files_or_names(self):
        with self.assertRaises(stratasim.BadInput):
            stratasim.sweep({"model": "gpt3-1.7b"})
        with self.assertRaises(stratasim.BadInput):
            stratasim.search(SMALL, gpus=8, objective="speed")

    def test_a_bad_grid_says_what_the_cli_says(self):
        # The same rule reads the CLI's flags and the module's arguments: the message is the
        # CLI's error line for the same values.
        for kwargs, flags in (({"tp": (0, 2)}, ["--tp", "0,2"]),
                              ({"zero": (0, 4)}, ["--zero", "0,4"]),
                              ({"recompute": ("none", "most")}, ["--recompute", "none,most"]),
                              ({"schedule": "1f1b,nope"}, ["--schedule", "1f1b,nope"])):
            with self.subTest(flags=flags):
                with tempfile.TemporaryDirectory() as tmp:
                    cli = subprocess.run([CLI, "sweep", SMALL, *flags, "--out",
                                          os.path.join(tmp, "x.csv")],
                                         capture_output=True, text=True)
                self.assertEqual(cli.returncode, 2)
                with self.assertRaises(stratasim.BadInput) as caught:
                    stratasim.sweep(SMALL, **kwargs)
                self.assertEqual("error: " + str(caught.exception), cli.stderr.strip())


class Flags(unittest.TestCase):
    def test_flags_derive_dp_as_the_cli_does(self):
        # --tp 2 --pp 2 without --dp: dp is derived from the cluster again (8 / 4 = 2).
        with tempfile.TemporaryDirectory() as tmp:
            run_cli("simulate", SMALL, "--tp", "2", "--pp", "2", "--micro-batch", "2", "--quiet",
                    "--out", tmp)
            with open(os.path.join(tmp, "report.json")) as f:
                expected = json.load(f)
        r = stratasim.simulate(SMALL, tp=2, pp=2, micro_batch=2)
        self.assertEqual(r.report, expected)
        self.assertEqual(stratasim.load(SMALL, tp=2, pp=2).dp, 2)
        with self.assertRaises(TypeError):
            stratasim.simulate(SMALL, tensor_parallel=2)


class DictExperiment(unittest.TestCase):
    def shipped(self, name):
        with open(os.path.join(SOURCE, "configs", "experiments", name + ".json")) as f:
            return json.load(f)

    def test_a_dict_with_catalog_names_simulates_as_the_file_it_mirrors(self):
        shipped = self.shipped(SMALL)
        self.assertTrue(shipped["model"].endswith("gpt3-1.7b.json"))
        self.assertTrue(shipped["cluster"].endswith("dgx-a100-1.json"))
        experiment = {"model": "gpt3-1.7b", "cluster": "dgx-a100-1",
                      "parallelism": shipped["parallelism"], "training": shipped["training"]}
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", os.path.join(SOURCE, "configs", "experiments", SMALL + ".json"),
                    "--quiet", "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        r = stratasim.simulate(experiment)
        self.assertEqual(r["iteration_time_s"], expected["iteration_time_s"])
        self.assertEqual(r["peak_memory_bytes"], expected["peak_memory_bytes"])
        # named like the file, it is the same report
        self.assertEqual(stratasim.simulate({**experiment, "name": SMALL}).report, expected)

    def test_a_dict_takes_overrides(self):
        shipped = self.shipped(TINY)
        experiment = {**shipped, "model": "gpt-tiny", "cluster": "dgx-a100-1"}
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", TINY, "--set", "parallelism.zero=1", "--quiet", "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        r = stratasim.simulate(experiment, set=["parallelism.zero=1"])
        self.assertEqual(r.report, expected)


class Memory(unittest.TestCase):
    def test_memory_equals_the_memory_command(self):
        printed = run_cli("memory", SMALL).stdout
        m = stratasim.memory(SMALL)
        self.assertEqual(m.memory_summary(), printed)
        self.assertEqual(m.summary(), printed)  # not a simulation's summary with zero times

    def test_peaks_equal_the_simulation_s(self):
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", TINY, "--set", "parallelism.zero=3", "--quiet", "--out", out)
            with open(os.path.join(out, "report.json")) as f:
                expected = json.load(f)
        m = stratasim.memory(TINY, set=["parallelism.zero=3"])
        self.assertEqual(m["peak_memory_bytes"], expected["peak_memory_bytes"])
        self.assertEqual(m["fits"], expected["fits"])
        self.assertEqual([r["peak_memory_bytes"] for r in m["ranks"]],
                         [r["peak_memory_bytes"] for r in expected["ranks"]])


class Sweep(unittest.TestCase):
    def test_rows_equal_the_sweep_csv(self):
        flags = ["--tp", "1,2", "--pp", "1,2", "--zero", "0,3", "--recompute", "none,full",
                 "--micro-batch", "1,2", "--set", "cluster.device.memory.capacity=24GiB"]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "x.csv")
            run_cli("sweep", SMALL, *flags, "--jobs", "2", "--quiet", "--out", path)
            expected = read_csv(path)
        rows = stratasim.sweep(SMALL, tp=(1, 2), pp=(1, 2), zero=(0, 3),
                               recompute=("none", "full"), micro_batch=(1, 2),
                               set=["cluster.device.memory.capacity=24GiB"], jobs=2, frame=False)
        self.assertEqual(len(rows), 32)
        self.assertEqual(len(rows), len(expected))
        self.assertEqual({r["status"] for r in rows} >= {"ok", "oom"}, True, "some fit, some not")
        for i, (row, want) in enumerate(zip(rows, expected)):
            self.assertEqual(list(row), list(want), f"row {i}: columns")
            for key, text in want.items():
                self.assertTrue(same_cell(text, row[key]), f"row {i} {key}: {text!r} != {row[key]!r}")

    def test_a_frame_has_the_same_rows(self):
        axes = dict(tp=(1, 2), pp=1, zero=0, recompute="none", micro_batch=1)
        rows = stratasim.sweep(SMALL, frame=False, **axes)
        frame = stratasim.sweep(SMALL, **axes)
        if not hasattr(frame, "to_dict"):
            self.skipTest("pandas is not installed")
        self.assertEqual(list(frame.columns), list(rows[0]))
        self.assertEqual(list(frame["tp"]), [r["tp"] for r in rows])
        self.assertEqual(list(frame["iteration_time_s"]), [r["iteration_time_s"] for r in rows])


    def test_setting_axes_equal_the_cli_axis(self):
        # --axis PATH=V1,V2 and axes={PATH: [V1, V2]}: the same rows, one column per path.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "x.csv")
            run_cli("sweep", SMALL, "--tp", "1", "--pp", "1,2", "--zero", "0", "--recompute",
                    "none", "--micro-batch", "1", "--axis", "training.global_batch=8,16",
                    "--quiet", "--out", path)
            expected = read_csv(path)
        rows = stratasim.sweep(SMALL, tp=1, pp=(1, 2), zero=0, recompute="none", micro_batch=1,
                               axes={"training.global_batch": [8, 16]}, frame=False)
        self.assertEqual(len(rows), 4)
        self.assertEqual([r["training.global_batch"] for r in rows], [8, 16, 8, 16])
        for i, (row, want) in enumerate(zip(rows, expected)):
            self.assertEqual(list(row), list(want), f"row {i}: columns")
            for key, text in want.items():
                self.assertTrue(same_cell(text, row[key]), f"row {i} {key}: {text!r} != {row[key]!r}")


class Search(unittest.TestCase):
    def test_rows_rank_and_pareto_equal_the_search_csv(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "search.csv")
            run_cli("search", SMALL, "--gpus", "8", "--zero", "0,1", "--recompute", "none,full",
                    "--micro-batch", "1,2", "--quiet", "--out", path)
            expected = read_csv(path)
        rows = stratasim.search(SMALL, gpus=8, zero=(0, 1), recompute=("none", "full"),
                                micro_batch=(1, 2), frame=False)
        self.assertEqual(len(rows), len(expected))
        for i, (row, want) in enumerate(zip(rows, expected)):
            self.assertEqual(list(row), list(want), f"row {i}: columns")
            for key, text in want.items():
                self.assertTrue(same_cell(text, row[key]), f"row {i} {key}: {text!r} != {row[key]!r}")
        # ranks 1..k over the combinations that fit, best first by tokens/s
        ranked = sorted((r for r in rows if r["rank"] is not None), key=lambda r: r["rank"])
        self.assertTrue(ranked)
        self.assertEqual([r["rank"] for r in ranked], list(range(1, len(ranked) + 1)))
        self.assertTrue(all(r["status"] == "ok" for r in ranked))
        speeds = [r["tokens_per_s"] for r in ranked]
        self.assertEqual(speeds, sorted(speeds, reverse=True))
        # the Pareto frontier: feasible, and no feasible row is both faster and smaller
        frontier = [r for r in rows if r["pareto"]]
        self.assertTrue(frontier)
        for f in frontier:
            self.assertEqual(f["status"], "ok")
            for r in ranked:
                self.assertFalse(r["iteration_time_s"] < f["iteration_time_s"] and
                                 r["peak_memory_bytes"] < f["peak_memory_bytes"], (f, r))


class SearchAxes(unittest.TestCase):
    """The opt-in axes (`--schedules`, `--interleave`, `--sequence-parallel`, `--try-fsdp`) as
    keywords: the same rows as the CLI's, and each axis adds the strategies it names."""

    # One sharding, recomputation and micro batch, so that the rows are the plans: on 8 GPUs
    # tp 1,2,4,8 (a node) x pp powers of two dividing 24 layers with tp * pp <= 8:
    # tp 1: pp 1,2,4,8; tp 2: pp 1,2,4; tp 4: pp 1,2; tp 8: pp 1 -- 10 plans.
    AXES = dict(zero=0, recompute="none", micro_batch=1)
    PLANS = 10

    @staticmethod
    def key(r):
        return (r["tp"], r["pp"], r["dp"], r["zero"], r["recompute"], r["micro_batch"])

    def test_rows_equal_the_cli_with_every_axis(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "search.csv")
            run_cli("search", SMALL, "--gpus", "8", "--zero", "0", "--recompute", "none",
                    "--micro-batch", "1", "--schedules", "1f1b,interleaved", "--interleave",
                    "2,4", "--sequence-parallel", "0,1", "--try-fsdp", "--quiet", "--out", path)
            expected = read_csv(path)
        rows = stratasim.search(SMALL, gpus=8, schedules=["1f1b", "interleaved"],
                                interleave=[2, 4], sequence_parallel=[False, True],
                                try_fsdp=True, frame=False, **self.AXES)
        self.assertEqual(len(rows), len(expected))
        for i, (row, want) in enumerate(zip(rows, expected)):
            self.assertEqual(list(row), list(want), f"row {i}: columns")
            for key, text in want.items():
                self.assertTrue(same_cell(text, row[key]), f"row {i} {key}: {text!r} != {row[key]!r}")

    def test_the_default_search_has_none_of_the_opt_in_strategies(self):
        rows = stratasim.search(SMALL, gpus=8, frame=False, **self.AXES)
        self.assertEqual(len(rows), self.PLANS)
        self.assertEqual({r["schedule"] for r in rows}, {"1f1b"})  # the experiment's
        self.assertEqual({r["framework"] for r in rows}, {None})
        self.assertEqual({r["sequence_parallel"] for r in rows}, {False})

    def test_schedules_and_interleave_add_interleaved_plans(self):
        plain = {self.key(r): r for r in stratasim.search(SMALL, gpus=8, frame=False,
                                                          **self.AXES)}
        rows = stratasim.search(SMALL, gpus=8, schedules="1f1b,interleaved", frame=False,
                                **self.AXES)
        # interleaved (2 chunks per device) needs pp > 1 and 24 layers divisible by 2 pp:
        # tp 1 pp 2,4; tp 2 pp 2,4; tp 4 pp 2 -- 5 plans beside the 10 of 1F1B.
        interleaved = [r for r in rows if r["schedule"] == "interleaved"]
        self.assertEqual(len(rows), self.PLANS + 5)
        self.assertEqual(sorted((r["tp"], r["pp"]) for r in interleaved),
                         [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2)])
        self.assertEqual({r["virtual_stages"] for r in interleaved}, {2})
        ranked = [r for r in interleaved if r["rank"] is not None]
        self.assertTrue(ranked, "an interleaved plan fits and is ranked")
        # Interleaving v chunks per device shrinks the pipeline bubble, (p - 1) / m of the
        # ideal time for 1F1B to (p - 1) / (v m) (Narayanan et al., SC'21, section 2.2).
        for r in ranked:
            with self.subTest(plan=self.key(r)):
                same = plain[self.key(r)]
                self.assertEqual(same["schedule"], "1f1b")
                self.assertLess(r["bubble_fraction"], same["bubble_fraction"])
        # 4 chunks per device too where 24 layers divide into 4 pp: pp 2 (tp 1, 2, 4).
        deeper = stratasim.search(SMALL, gpus=8, schedules=("1f1b", "interleaved"),
                                  interleave=(2, 4), frame=False, **self.AXES)
        self.assertEqual(sorted((r["tp"], r["pp"]) for r in deeper
                                if r["schedule"] == "interleaved" and r["virtual_stages"] == 4),
                         [(1, 2), (2, 2), (4, 2)])

    def test_try_fsdp_adds_fsdp_plans(self):
        rows = stratasim.search(SMALL, gpus=8, try_fsdp=True, frame=False, **self.AXES)
        # FSDP needs pp 1 and dp > 1: tp 1 dp 8, tp 2 dp 4, tp 4 dp 2 (tp 8 leaves dp 1).
        fsdp = [r for r in rows if r["framework"] == "fsdp"]
        self.assertEqual(len(rows), self.PLANS + 3)
        self.assertEqual(sorted((r["tp"], r["pp"], r["dp"]) for r in fsdp),
                         [(1, 1, 8), (2, 1, 4), (4, 1, 2)])
        self.assertEqual({r["zero"] for r in fsdp}, {3})  # FULL_SHARD: ZeRO-3's states
        self.assertTrue(any(r["rank"] is not None for r in fsdp), "an FSDP plan is ranked")

    def test_sequence_parallel_adds_plans_with_less_memory(self):
        rows = stratasim.search(SMALL, gpus=8, sequence_parallel=(0, 1), frame=False,
                                **self.AXES)
        # on with tp > 1 only: tp 2 (pp 1,2,4), tp 4 (pp 1,2), tp 8 (pp 1) -- 6 plans.
        on = [r for r in rows if r["sequence_parallel"]]
        self.assertEqual(len(rows), self.PLANS + 6)
        self.assertTrue(all(r["tp"] > 1 for r in on))
        off = {self.key(r): r for r in rows if not r["sequence_parallel"]}
        # Sequence parallelism divides the activations kept outside the tensor-parallel
        # blocks by tp as well: sbh(10 + 24/t) -> sbh(34/t) per layer without the attention
        # scores (Korthikanti et al., MLSys'23, table 2), so less memory at the same plan.
        for r in on:
            with self.subTest(plan=self.key(r)):
                self.assertLess(r["peak_memory_bytes"], off[self.key(r)]["peak_memory_bytes"])
        # on alone: the 6 plans with tp > 1, all with sequence parallelism
        only = stratasim.search(SMALL, gpus=8, sequence_parallel=True, frame=False, **self.AXES)
        self.assertEqual(sorted(self.key(r) for r in only), sorted(self.key(r) for r in on))
        self.assertTrue(all(r["sequence_parallel"] for r in only))

    def test_bad_axes_say_what_the_cli_says(self):
        for kwargs, flags in (({"schedules": "1f1b,nope"}, ["--schedules", "1f1b,nope"]),
                              ({"interleave": 1}, ["--interleave", "1"]),
                              ({"sequence_parallel": (0, 2)}, ["--sequence-parallel", "0,2"])):
            with self.subTest(flags=flags):
                expected = cli_error("search", SMALL, "--gpus", "8", *flags)
                self.assertIn(flags[0], expected)
                with self.assertRaises(stratasim.BadInput) as caught:
                    stratasim.search(SMALL, gpus=8, **kwargs)
                self.assertEqual(str(caught.exception), expected)
        with self.assertRaises(TypeError) as caught:
            stratasim.search(SMALL, gpus=8, try_fsdp="yes")
        self.assertIn("try_fsdp", str(caught.exception))


class Timeline(unittest.TestCase):
    def check_spans(self, r, ranks):
        t = r.timeline(frame=False)
        self.assertEqual(set(t), {"rank", "stream", "op", "phase", "microbatch", "label",
                                  "start_s", "end_s"})
        n = len(t["rank"])
        self.assertGreater(n, 0)
        for column in t.values():
            self.assertEqual(len(column), n)
            self.assertTrue(hasattr(column, "dtype"), "a numpy array")
        self.assertTrue((t["end_s"] >= t["start_s"]).all())
        span = float(t["end_s"].max() - t["start_s"].min())
        self.assertTrue(math.isclose(span, r["iteration_time_s"], rel_tol=1e-9),
                        (span, r["iteration_time_s"]))
        self.assertEqual(sorted(set(t["rank"].tolist())), ranks)
        self.assertLessEqual(set(t["phase"].tolist()),
                             {"forward", "backward", "recompute", "optimizer", "other"})
        self.assertIn("compute", set(t["stream"].tolist()))
        return t

    def test_every_rank_of_an_exact_simulation(self):
        r = stratasim.simulate(TINY, exact=True)
        t = self.check_spans(r, list(range(8)))
        # as many spans as timeline.json holds complete events
        with tempfile.TemporaryDirectory() as out:
            run_cli("simulate", TINY, "--exact", "--quiet", "--out", out)
            with open(os.path.join(out, "timeline.json")) as f:
                events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        self.assertEqual(len(t["rank"]), len(events))
        self.assertEqual(sorted(t["op"].tolist()), sorted(e["args"]["op"] for e in events))

    def test_mirrored_replicas_trace_the_ranks_that_run_ops(self):
        r = stratasim.simulate(TINY)  # dp 2 mirrored: data-parallel rank 0 of each stage
        self.check_spans(r, [0, 1, 4, 5])
        self.check_spans(stratasim.simulate(SMALL), [0])

    def test_memory_samples_peak_at_the_report_s_peak(self):
        r = stratasim.simulate(TINY, exact=True)
        m = r.memory(frame=False)
        self.assertEqual(set(m), {"rank", "tier", "time_s", "total_bytes", "op"})
        for rank in r["ranks"]:
            device = (m["rank"] == rank["rank"]) & (m["tier"] == "device")
            self.assertTrue(device.any(), rank["rank"])
            self.assertLessEqual(int(m["total_bytes"][device].max()), rank["peak_memory_bytes"])
        self.assertEqual(len(stratasim.memory(TINY).memory(frame=False)["rank"]), 0)

    def test_frames_when_pandas_is_there(self):
        try:
            import pandas
        except ImportError:
            self.skipTest("pandas is not installed")
        r = stratasim.simulate(TINY)
        frame = r.timeline()
        self.assertIsInstance(frame, pandas.DataFrame)
        self.assertEqual(len(frame), len(r.timeline(frame=False)["rank"]))
        self.assertAlmostEqual(frame.end_s.max() - frame.start_s.min(), r["iteration_time_s"])
        self.assertIsInstance(r.memory(), pandas.DataFrame)
        self.assertIsInstance(stratasim.search(SMALL, gpus=8, zero=0, recompute="none",
                                               micro_batch=1), pandas.DataFrame)


if __name__ == "__main__":
    unittest.main(verbosity=2)
