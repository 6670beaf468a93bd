// Launchers on pasted command lines (strategies/launch_line.hpp): the world each starts, the
// script and its arguments. Expected sizes are the launchers' documented meanings of their
// options (torchrun, deepspeed, srun, mpirun), read off the lines by hand.
#include "strategies/launch_line.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/foreign_inputs.hpp"

namespace {

using stratasim::config::ConfigError;
using stratasim::strategies::LaunchLine;
using stratasim::strategies::read_launch_line;
using stratasim::strategies::split_shell_words;

LaunchLine line(const std::string& text) {
  return read_launch_line(split_shell_words(text, "test"), "test");
}

std::string error_of(const std::string& text) {
  try {
    line(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the world size in a launch line is read: torchrun --nnodes x --nproc_per_node") {
  auto l = line(
      "torchrun --nnodes 2 --nproc_per_node 8 --master_addr host0 --master_port 6000 "
      "pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 24");
  REQUIRE(l.nodes);
  REQUIRE(l.per_node);
  CHECK(l.nodes->value == 2);
  CHECK(l.nodes->given == "--nnodes 2");
  CHECK(l.per_node->value == 8);
  CHECK_FALSE(l.world);
  CHECK(l.launchers == std::vector<std::string>{"torchrun"});
  CHECK(l.script == std::vector<std::string>{"pretrain_gpt.py"});
  CHECK(l.args ==
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--num-layers", "24"});
  // The = form and the dashed spelling; --standalone takes no value.
  l = line("torchrun --standalone --nnodes=1 --nproc-per-node=4 train.py --bf16");
  CHECK(l.nodes->value == 1);
  CHECK(l.per_node->value == 4);
  CHECK(l.args == std::vector<std::string>{"--bf16"});
  // torchrun's defaults once one size is given: --nnodes 1, --nproc_per_node 1.
  l = line("torchrun --nproc_per_node 8 pretrain_gpt.py --bf16");
  CHECK(l.nodes->value == 1);
  l = line("torchrun --nnodes 2 pretrain_gpt.py");
  CHECK(l.per_node->value == 1);
  // "gpu" / "auto": every GPU of the node, the cluster's.
  l = line("torchrun --nnodes 4 --nproc_per_node gpu pretrain_gpt.py");
  CHECK(l.nodes->value == 4);
  CHECK_FALSE(l.per_node);
  // No size given: none.
  l = line("torchrun pretrain_gpt.py --bf16");
  CHECK_FALSE(l.nodes);
  CHECK_FALSE(l.per_node);
}

TEST_CASE("the world size in a launch line is read: python -m torch.distributed.run / launch") {
  auto l = line(
      "CUDA_DEVICE_MAX_CONNECTIONS=1 python3 -u -m torch.distributed.run --nnodes 2 "
      "--nproc_per_node 8 --node_rank 0 pretrain_gpt.py --bf16");
  CHECK(l.nodes->value == 2);
  CHECK(l.per_node->value == 8);
  CHECK(l.launchers == std::vector<std::string>{"python -m torch.distributed.run"});
  CHECK(l.args == std::vector<std::string>{"--bf16"});
  l = line("python -m torch.distributed.launch --nproc_per_node=8 --use_env train.py --fp16");
  CHECK(l.per_node->value == 8);
  CHECK(l.nodes->value == 1);
  CHECK(l.args == std::vector<std::string>{"--fp16"});
  // python running the script directly is no launcher: no size, the script's arguments.
  l = line("python pretrain_gpt.py --bf16");
  CHECK(l.launchers.empty());
  CHECK_FALSE(l.nodes);
}

TEST_CASE("the world size in a launch line is read: deepspeed --num_nodes x --num_gpus") {
  auto l = line(
      "deepspeed --num_nodes 2 --num_gpus 8 --master_port 29500 --hostfile hosts train.py "
      "--deepspeed --deepspeed_config ds.json --tensor-model-parallel-size 2");
  CHECK(l.nodes->value == 2);
  CHECK(l.per_node->value == 8);
  CHECK(l.script == std::vector<std::string>{"train.py"});
  CHECK(l.args.front() == "--deepspeed");
  // -1 (the default): every node of the hostfile, every GPU: the cluster's.
  l = line("deepspeed --num_gpus -1 --num_nodes=4 train.py");
  CHECK(l.nodes->value == 4);
  CHECK_FALSE(l.per_node);
}

TEST_CASE("the world size in a launch line is read: srun and mpirun prefixes") {
  auto l = line("srun -N 4 --ntasks-per-node=8 --exclusive python pretrain_gpt.py --bf16");
  CHECK(l.nodes->value == 4);
  CHECK(l.per_node->value == 8);
  CHECK(l.script == std::vector<std::string>{"python", "pretrain_gpt.py"});
  CHECK(l.args == std::vector<std::string>{"--bf16"});
  l = line("srun -N2 --gpus-per-node=h100:8 -p batch python train.py");
  CHECK(l.nodes->value == 2);
  CHECK(l.per_node->value == 8);
  // Nested: srun's nodes, torchrun's processes per node.
  l = line("srun --nodes 2 torchrun --nproc_per_node 8 pretrain_gpt.py --bf16");
  CHECK(l.launchers == std::vector<std::string>{"srun", "torchrun"});
  CHECK(l.per_node->value == 8);
  // mpirun: -np the world, -npernode (or --map-by ppr:G:node) per node.
  l = line("mpirun -np 16 -npernode 8 -x NCCL_DEBUG=INFO python pretrain_gpt.py --bf16");
  CHECK(l.world->value == 16);
  CHECK(l.per_node->value == 8);
  CHECK_FALSE(l.nodes);
  CHECK(l.args == std::vector<std::string>{"--bf16"});
  l = line("mpirun -n 32 --map-by ppr:4:node python3 train.py");
  CHECK(l.world->value == 32);
  CHECK(l.per_node->value == 4);
  // Arguments alone, as before: no launcher.
  l = line("--tensor-model-parallel-size 2");
  CHECK(l.launchers.empty());
  CHECK(l.args.size() == 2);
}

TEST_CASE("a launch line size that is not one whole number is an error naming the option") {
  CHECK(error_of("torchrun --nnodes $NNODES --nproc_per_node 8 pretrain_gpt.py")
            .find("test: at --nnodes: expected a number of nodes from 1 to 16777216, got "
                  "\"$NNODES\" (a shell variable") != std::string::npos);
  CHECK(error_of("torchrun --nnodes 1:4 pretrain_gpt.py").find("elastic range") !=
        std::string::npos);
  CHECK(error_of("deepspeed --num_gpus 0 train.py").find("at --num_gpus") != std::string::npos);
  CHECK(error_of("mpirun -np x python train.py").find("at -np") != std::string::npos);
  // "2:2" is one size.
  CHECK(line("torchrun --nnodes 2:2 --nproc_per_node 8 t.py").nodes->value == 2);
}
