"""stratasim from Python: the simulator's composition layer (study/) and its sweep and search.

    import stratasim
    r = stratasim.simulate("gpt3-175b-a100-1024", set=["parallelism.zero=1"])
    print(r["iteration_time_s"], r["mfu"])        # the report, as report.json holds it
    print(r.summary())                             # the summary `stratasim simulate` prints
    spans = r.timeline()                           # columns of arrays (a DataFrame with pandas)

An experiment is a file, a name from configs/experiments, a dict written like an experiment
file (model and cluster may be names from the catalog), or an Experiment from load(). `set`
takes the CLI's `--set dotted.key=value` overrides. Errors are exceptions with the CLI's
message: BadInput (a ValueError) for input, SimulationFailed (a RuntimeError) for a program
that cannot run or a simulation that does not complete.
"""

import csv
import io
import json

import numpy as _numpy

from . import _core
from ._core import BadInput, Experiment, SimulationFailed

__version__ = _core.__version__
__all__ = ["load", "simulate", "memory", "sweep", "search", "cluster", "cluster_trace", "Result", "Experiment", "BadInput",
           "SimulationFailed"]

try:  # pandas is optional (Debian's python3-pandas): DataFrames where it is installed
    import pandas as _pandas
except ImportError:  # pragma: no cover - depends on the machine
    _pandas = None


def _columns(native, frame):
    """Columns as numpy arrays (strings too), or a DataFrame of them where pandas is there."""
    columns = {k: _numpy.asarray(v) for k, v in native.items()}
    return _pandas.DataFrame(columns) if frame and _pandas is not None else columns


def _sets(set):
    if set is None:
        return []
    if isinstance(set, str):
        return [set]
    if isinstance(set, dict):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in set.items()]
    return list(set)


# The CLI's experiment flags as keyword arguments: (flag, key of the experiment document).
_FLAGS = {"tp": "parallelism.tp", "pp": "parallelism.pp", "dp": "parallelism.dp",
          "micro_batch": "parallelism.micro_batch", "global_batch": "training.global_batch",
          "seq_len": "training.seq_len", "schedule": "parallelism.schedule",
          "zero": "parallelism.zero", "recompute": "parallelism.recompute"}


def _flag_sets(flags):
    """The keyword flags as `--set` overrides. As on the command line, a tp or pp without dp
    derives dp from the cluster again."""
    unknown = sorted(k for k in flags if k not in _FLAGS)
    if unknown:
        raise TypeError("unknown experiment flag(s): " + ", ".join(unknown) +
                        " (known: " + ", ".join(_FLAGS) + ")")
    out = [f"{_FLAGS[k]}={v if isinstance(v, str) else json.dumps(v)}"
           for k, v in flags.items() if v is not None]
    if (flags.get("tp") is not None or flags.get("pp") is not None) and flags.get("dp") is None:
        out.append("parallelism.dp=null")
    return out


def load(experiment, set=None, **flags):
    """An Experiment from a file, a catalog name or a dict, with `--set`-style overrides and the
    CLI's experiment flags as keywords (tp=4, pp=2, micro_batch=2, zero=1, ...): flags first,
    then `set`, as the command line applies them."""
    if flags:
        set = _flag_sets(flags) + _sets(set)
    if isinstance(experiment, Experiment):
        if set:
            raise BadInput("set: an Experiment is already loaded; pass its file or dict instead")
        return experiment
    if isinstance(experiment, dict):
        if "name" not in experiment:  # a file needs one; a dict is named "<dict>" in reports
            experiment = {"name": "<dict>", **experiment}
        return _core.from_json(json.dumps(experiment), _sets(set))
    return _core.load(str(experiment), _sets(set))


class Result:
    """One simulated (or memory-estimated) iteration.

    r[key] reads the report (the keys of report.json); r.report is the whole dict.
    """

    def __init__(self, native, timed=True):
        self._native = native
        self._timed = timed  # False: memory(), an estimate without times
        self.report = json.loads(native.report_json())

    def __getitem__(self, key):
        return self.report[key]

    def keys(self):
        return self.report.keys()

    @property
    def completed(self):
        return self._native.completed()

    def summary(self):
        """The summary the command prints: `stratasim simulate`'s, or for memory()
        `stratasim memory`'s (its times would all be zero)."""
        return self._native.summary() if self._timed else self._native.memory_summary()

    def memory_summary(self):
        """The summary `stratasim memory` prints."""
        return self._native.memory_summary()

    def timeline(self, frame=True):
        """Every op's span: rank, stream, op, phase, microbatch (-1: none), label, start_s,
        end_s, for every simulated rank (where replicas are mirrored, those that run ops;
        exact=True simulates all)."""
        return _columns(self._native.spans(), frame)

    def memory(self, frame=True):
        """Every change of a traced rank's allocation (simulate's trace_ranks), as memory.csv:
        rank, tier, time_s, total_bytes, op. Empty for memory(), which does not time ops."""
        return _columns(self._native.memory(), frame)

    def write(self, directory):
        """Writes report.json, timeline.json and memory.csv as `stratasim simulate --out`."""
        self._native.write(str(directory))

    def __repr__(self):
        return (f"<stratasim.Result {self.report.get('experiment', '')}: "
                f"{self.report.get('iteration_time_s', 0):.4g} s per iteration>")


def simulate(experiment, set=None, exact=False, trace_ranks="auto", profile=None,
             network=None, check=True, iterations=1, **flags):
    """Simulates one training iteration (`stratasim simulate`), or `iterations` back to back
    (`--iterations`: the report's iteration time is their mean); `flags` are load()'s. With
    check, a simulation that does not complete raises SimulationFailed; otherwise the Result
    says so (completed)."""
    native = _core.simulate(load(experiment, set, **flags), exact, str(trace_ranks),
                            "" if profile is None else str(profile),
                            "" if network is None else str(network), int(iterations))
    if check and not native.completed():
        raise SimulationFailed("the simulation did not complete: " + native.problem())
    return Result(native)


def memory(experiment, set=None, exact=False, **flags):
    """Peak memory per rank without timing (`stratasim memory`); `flags` are load()'s."""
    return Result(_core.memory(load(experiment, set, **flags), exact), timed=False)


def _value(text):
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _rows(text, frame):
    rows = [{k: _value(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]
    return _pandas.DataFrame(rows) if frame and _pandas is not None else rows


def _experiment_name(experiment):
    if isinstance(experiment, (dict, Experiment)):
        raise BadInput("sweep and search take an experiment file or catalog name")
    return str(experiment)


def _text(values):
    """A grid axis as the CLI writes it: "1,2,4", "0..3"; a list or a single value too (a bool
    is 0 or 1, as sequence parallelism is written)."""
    if values is None:
        return None
    if isinstance(values, bool):
        return str(int(values))
    if isinstance(values, (str, int, float)):
        return str(values)
    return ",".join(str(int(v)) if isinstance(v, bool) else str(v) for v in values)


def sweep(experiment, tp=None, pp=None, zero=None, recompute=None, micro_batch=None, dp=None,
          schedule=None, sequence_parallel=None, set=None, jobs=0, exact=False, frame=True,
          axes=None):
    """Every combination of the grid, simulated (`stratasim sweep`): the CSV's rows. Axes take
    lists or the CLI's text ("1,2,4", "0..3"); axes left out take the CLI's defaults (tp
    1,2,4,8; pp 1,2,4,8,16; zero 0..3; recompute none,selective,full; micro batch 1,2,4; dp,
    schedule and sequence parallelism the experiment's; a DLRM or RNN model keeps its own tp,
    pp, zero, recompute and micro batch).

    axes: setting axes over any config value (`--axis`), a dict {path: values} in order, e.g.
    {"embedding_cache.capacity": [0.001, 0.015, 1]}; each path becomes a column."""
    grid = _core.GridText()
    if axes:
        grid.settings = [f"{path}={_text(values)}" for path, values in axes.items()]
    for name, values in (("tp", tp), ("pp", pp), ("zero", zero), ("recompute", recompute),
                         ("micro_batch", micro_batch), ("dp", dp), ("schedule", schedule),
                         ("sequence_parallel", sequence_parallel)):
        if values is not None:
            setattr(grid, name, _text(values))
    text = _core.sweep(_experiment_name(experiment), _sets(set), grid, jobs, exact)
    return _rows(text, frame)


def search(experiment, gpus, objective="throughput", zero="0..3",
           recompute="none,selective,full", micro_batch="1,2,4", min_gpus=0, set=None, jobs=0,
           exact=False, frame=True, *, schedules=None, interleave="2", sequence_parallel=None,
           try_fsdp=False):
    """The best strategies for a GPU budget (`stratasim search`): every combination with its
    rank by the objective (None where it does not fit) and whether it is on the Pareto
    frontier of iteration time against peak memory. Defaults are the CLI's.

    The opt-in axes (keyword-only) are the CLI's flags of the same names (docs/sweep.md); left
    out, the experiment's own setting is kept and the space is the default search's:

    - schedules: pipeline schedules tried ("1f1b,interleaved" or a list; `--schedules`);
    - interleave: virtual stages (model chunks per device, each >= 2) tried with the
      interleaved schedule (default, or None: 2; `--interleave`);
    - sequence_parallel: Megatron's sequence parallelism tried, 0, 1 or both ((0, 1),
      (False, True) or "0,1"; `--sequence-parallel`), with tp > 1;
    - try_fsdp: also PyTorch FSDP (FULL_SHARD) where pp is 1 (`--try-fsdp`); its rows have
      framework "fsdp".

    A bad value raises BadInput with the CLI's message, which names the flag."""
    if not isinstance(try_fsdp, bool):
        raise TypeError(f"try_fsdp expects True or False, got {try_fsdp!r}")
    text = _core.search(_experiment_name(experiment), _sets(set), int(gpus), objective,
                        _text(zero), _text(recompute), _text(micro_batch), int(min_gpus),
                        _text(schedules) or "", "2" if interleave is None else _text(interleave),
                        _text(sequence_parallel) or "", try_fsdp, jobs, exact)
    return _rows(text, frame)


def cluster(trace, cluster, scheduler="fifo", trace_format="jsonl", seed=0, restart_cost="30 s",
            tick=None, frame=True):
    """Many jobs on a shared cluster under a scheduler (`stratasim cluster`; docs/cluster.md).

    trace: a job trace file (jsonl, or philly / helios with trace_format); cluster: a cluster
    config or catalog name, its devices the GPUs; scheduler: fifo, srtf, tiresias, pollux or ones;
    seed: the stochastic policies' (ones); tick: seconds between periodic decisions (None: the
    policy's default). Returns a dict: "summary" (summary.json's fields, "utilisation" as
    [[time_s, busy_gpus], ...]), "jobs" (jobs.csv's rows: a DataFrame with pandas, else a list of
    dicts) and "timeline" (timeline.json, the Chrome trace, as a dict)."""
    jobs, summary, timeline = _core.cluster(str(trace), str(cluster), scheduler, trace_format,
                                            int(seed), restart_cost,
                                            float(tick) if tick is not None else 0.0)
    return {"summary": json.loads(summary), "jobs": _rows(jobs, frame),
            "timeline": json.loads(timeline)}


def cluster_trace(format="philly", jobs=100, gpus=64, seed=1, load=1.0, days=0.0, mix=None):
    """A generated Philly- or Helios-like job trace's text (`stratasim cluster-trace generate`;
    cluster/workload.hpp): write it to a file and pass it to cluster() with its trace_format."""
    if mix is None:
        mix = "helios" if format == "helios" else "philly"
    return _core.cluster_trace(format, mix, int(jobs), int(gpus), float(load), float(days),
                               int(seed))
