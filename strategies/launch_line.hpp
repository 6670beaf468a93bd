// The launcher before a training script on a pasted command line, and the world it starts:
//
//   torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 ...
//   python -m torch.distributed.run ... / python -m torch.distributed.launch ...
//   deepspeed --num_nodes 2 --num_gpus 8 pretrain_gpt.py --deepspeed --deepspeed_config ds.json
//   srun -N 2 --ntasks-per-node 8 python pretrain_gpt.py ...
//   mpirun -np 16 -npernode 8 python pretrain_gpt.py ...
//
// Launchers may be nested (srun ... torchrun ...) and preceded by VAR=value assignments and
// other wrappers ("uv run", "nsys profile -o out": the prefix, ignored); the script
// ("pretrain_gpt.py", "python pretrain_gpt.py") ends them. What each launcher's options
// mean (their documentation):
// - torchrun (torch.distributed.run; torch.distributed.launch the same): --nnodes N (default 1;
//   an elastic range "MIN:MAX" is not one size: an error), --nproc_per_node / --nproc-per-node G
//   (default 1; "gpu" or "auto": every GPU of the node, the cluster's devices_per_node).
// - deepspeed: --num_nodes N, --num_gpus / --num-gpus G (default -1: every node of the hostfile,
//   every GPU of a node; then the cluster's).
// - srun (Slurm): -N / --nodes N (a range "MIN-MAX" is an error), --ntasks-per-node or
//   --gpus-per-node G ("type:G" too), -n / --ntasks W (the world).
// - mpirun / mpiexec (Open MPI, MPICH, Intel MPI): -np / -n / --np W (the world), -npernode /
//   --npernode / -N / -ppn / --ppn G, --map-by ppr:G:node.
// A size given by no launcher stays the experiment cluster's. Every other option is skipped with
// its value where it takes one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stratasim::strategies {

/// One size a launch line gives and the words that gave it ("--nnodes 2"), for origins and errors.
struct LaunchSize {
  std::int64_t value = 0;
  std::string given;
};

struct LaunchLine {
  std::vector<std::string> prefix;     // words before the first launcher ("uv run"), ignored
  std::vector<std::string> launchers;  // as written ("torchrun", "srun"), outermost first
  std::optional<LaunchSize> nodes;     // nodes
  std::optional<LaunchSize> per_node;  // processes (GPUs) per node
  std::optional<LaunchSize> world;     // processes in all (mpirun -np, srun -n)
  std::vector<std::string> script;     // the words naming the script ("python", "train.py")
  std::vector<std::string> args;       // the script's arguments, the rest of the line
};

/// Splits `words` (a command line split as a shell does) into the launchers' sizes, the script
/// and its arguments. Words that do not start with a launcher are all arguments (no launcher, no
/// script). A size that is not a whole number from 1 to 2^24 ("$NNODES" not expanded, "1:4") is
/// a config::ConfigError naming `source` and the option.
LaunchLine read_launch_line(const std::vector<std::string>& words, const std::string& source);

}  // namespace stratasim::strategies
