// What an accelerator is: peak rates, memory, launch overhead and the efficiency figures the
// roofline cost model uses. Figures are per device.
//
// Two kinds of device:
// - "gpu": peak rates per dtype, device memory (HBM), SMs and the GEMM tile that sets tile and
//   wave quantisation (docs/gemm-efficiency.md);
// - "fpga": a DSP array (DSP count x clock x operations per DSP per cycle gives the peak per
//   dtype), the fraction of it a layer-pipelined dataflow design keeps busy, on-chip SRAM
//   (BRAM + URAM, or M20K), off-chip memory (HBM and/or DDR), the host PCIe link and the
//   FPGA-to-FPGA network ports (docs/fpga.md). peak(), memory_capacity and memory_bandwidth are
//   derived from these (off-chip memory), so code that only needs a roofline works unchanged.
//
// Either kind may carry a measured profile (hw_models/profile.hpp) that replaces the modelled
// GEMM efficiency and other figures where it has measurements.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/kernel_model.hpp"
#include "hw_models/profile.hpp"
#include "hw_models/units.hpp"

namespace stratasim::hw {

struct DeviceEfficiency {
  double gemm = 0.8;       // fraction of peak a large, well-shaped GEMM reaches (0, 1]
  double attention = 0.5;  // fraction of peak a fused attention kernel reaches (0, 1]
  double memory = 0.85;    // fraction of memory bandwidth a streaming kernel reaches (0, 1]
  int tile_m = 128;        // GEMM output tile the libraries use; sets tile/wave quantisation
  int tile_n = 128;
  /// Set from the experiment's training framework (strategies::TrainingSpec), not from device
  /// files: the share of the device's GEMM and fused-attention rates (calibrated or modelled)
  /// that the framework's kernels reach inside a training step (0, 1], and how many times the
  /// bytes of memory-bound kernels it moves (>= 1: unfused eager operations, extra casts and
  /// copies). framework_attention: how many times faster (> 1) or slower its fused-attention
  /// kernels run than the calibrated kernel class they are costed as (applied on top of
  /// framework_compute). docs/frameworks.md says what each framework's values are fitted to.
  double framework_compute = 1.0;
  double framework_memory_traffic = 1.0;
  double framework_attention = 1.0;
  /// Also set from the experiment, not from device files: the share of the calibrated kernel
  /// model's GEMM and fused-attention rates this device's die holds inside training steps,
  /// relative to the reference die's (strategies::die_training: fitted with the frameworks to
  /// the end-to-end runs, docs/frameworks.md). Applied only where the kernel model (not a
  /// measured profile) sets the rate. > 0.
  double die_gemm = 1.0;
  double die_attention = 1.0;
};

/// A memory of an FPGA card: on-chip SRAM, in-package HBM or on-board DDR.
struct MemoryTierSpec {
  Bytes capacity;
  Bandwidth bandwidth;  // aggregate peak over all banks/channels (bytes/s)
};

/// Links of an FPGA card: its PCIe link to the host, or its network ports (QSFP28).
struct PortSpec {
  int count = 1;
  Bandwidth bandwidth;  // per port, per direction (bytes/s)
  Time latency;         // per message
};

/// The figures of an FPGA (kind "fpga"). Operations per DSP per cycle count FLOPs as the GPU
/// figures do (2 per multiply-add): a DSP48E2 packing two int8 multiply-adds does 4 int8
/// operations per cycle; a fp16 multiply-add spread over 2 DSPs does 1 FLOP per DSP per cycle.
struct FpgaSpec {
  std::int64_t dsp_count = 0;  // DSP slices (Xilinx DSP48E2) or AI tensor blocks (Intel NX)
  double clock_hz = 0;         // the clock the DSP array runs at in the design
  /// FLOPs one DSP completes per cycle, per dtype (index: DType); absent: no datapath for it.
  std::array<std::optional<double>, std::size(kAllDTypes)> ops_per_dsp_per_cycle{};
  /// Integer operations per DSP per cycle in int8 (stratasim has no int8 DType yet: reported,
  /// not used for costing).
  std::optional<double> int8_ops_per_dsp_per_cycle;
  /// Fraction of the DSP array a layer-pipelined dataflow design keeps busy (0, 1]: replaces
  /// the GPU's efficiency.gemm and tile/wave quantisation.
  double dataflow_efficiency = 0.8;
  MemoryTierSpec on_chip;             // BRAM + URAM (Xilinx) or M20K (Intel)
  std::optional<MemoryTierSpec> hbm;  // in-package HBM
  std::optional<MemoryTierSpec> ddr;  // on-board DDR4
  std::optional<PortSpec> pcie;       // link to the host
  std::optional<PortSpec> network;    // FPGA-to-FPGA ports; absent: PCIe only

  /// dsp_count * clock_hz * ops_per_dsp_per_cycle[t], when the dtype has a datapath.
  std::optional<FlopRate> peak(DType t) const;
  /// dsp_count * clock_hz * int8_ops_per_dsp_per_cycle (integer operations per second).
  std::optional<double> int8_peak_ops() const;
  /// Off-chip capacity: HBM + DDR.
  Bytes off_chip_capacity() const;
  /// Off-chip bandwidth that kernels stream from: HBM's when the card has HBM, else DDR's.
  Bandwidth off_chip_bandwidth() const;
  /// Checks ranges; throws config::ValidationError with a path relative to the "fpga" object.
  void validate() const;
};

struct DeviceSpec {
  std::string name;
  std::string kind = "gpu";  // "gpu" or "fpga"
  std::string source;
  /// Names under which published measurements of this device's compute appear (the "gpu" of
  /// tests/reference/calibration.json's cases): what `stratasim calibrate --fit` fits it to and
  /// `stratasim accuracy` maps cases by. A device with another device's compute die (H200's is
  /// H100's) may list that device's names too.
  std::vector<std::string> published_names;
  /// The GPU's compute die ("GA100", "GH100", ...; empty when not given, and on FPGAs): devices
  /// with one die (A100 40 GB and 80 GB; H100 and H200) share what the end-to-end fit learns
  /// of it (DeviceEfficiency::die_gemm, die_attention).
  std::string die;
  /// Dense peak rate per dtype (FLOP/s); absent when the device has no such unit. Derived
  /// from the DSP array for FPGAs.
  std::array<std::optional<FlopRate>, std::size(kAllDTypes)> peak_flops{};
  Bytes memory_capacity;       // device memory (HBM); an FPGA's off-chip memory (HBM + DDR)
  Bandwidth memory_bandwidth;  // its bandwidth (bytes/s); an FPGA's HBM, else DDR
  /// Fixed cost per kernel: a GPU's launch; an FPGA's per-kernel control and pipeline fill.
  Time kernel_launch_overhead = Time::us(4);
  int compute_units = 108;  // SMs: how many GEMM tiles run at once (GPUs)
  DeviceEfficiency efficiency;
  std::optional<FpgaSpec> fpga;  // present exactly when kind == "fpga"
  /// Measured figures (hw_models/profile.hpp); shared, as device specs are copied freely.
  std::shared_ptr<const DeviceProfile> profile;
  /// The calibrated kernel model (hw_models/kernel_model.hpp): fitted GEMM and attention
  /// parameters that replace efficiency.gemm and efficiency.attention where it has them; a
  /// measured profile's figures win over it. Shared, as device specs are copied freely.
  std::shared_ptr<const KernelModel> kernel_model;

  bool is_fpga() const { return fpga.has_value(); }
  /// Peak for `t`, falling back as hardware does: tf32 -> fp32, bf16 <-> fp16, fp8 -> fp16
  /// (an FP8 kernel on a GPU without FP8 tensor cores runs as 16-bit). fp4 has no fallback:
  /// only devices with FP4 tensor cores (Blackwell) quote it. Throws std::invalid_argument when
  /// the device has no usable rate.
  FlopRate peak(DType t) const;
  /// Whether the device quotes a rate of its own for `t` (no fallback): what training in fp8
  /// or fp4 needs (strategies/precision.hpp).
  bool has_native_peak(DType t) const {
    return peak_flops[static_cast<std::size_t>(t)].has_value();
  }
  /// Checks ranges; throws config::ValidationError with the offending key's path.
  void validate() const;
};

/// An FPGA device built from its figures: kind "fpga", peak_flops from the DSP array,
/// memory_capacity and memory_bandwidth from the off-chip memory, efficiency.gemm =
/// dataflow_efficiency, a 1 us per-kernel overhead.
DeviceSpec make_fpga_device(std::string name, FpgaSpec fpga);

/// Reads a device from the object at `path` of `doc` (strict; validated). FPGA keys (the
/// "fpga" object) are rejected on GPUs; GPU keys that an FPGA derives ("peak_flops", "memory")
/// or lacks ("compute_units", "efficiency.gemm", tiles) are rejected on FPGAs. A "profile" is
/// an object or the path of a profile file, relative to the file that names it; so is a
/// "kernel_model" (GPUs only). Either must name this device.
DeviceSpec read_device(const config::Document& doc, const std::string& path);

/// Parses a clock frequency: "300 MHz", "1.2 GHz", "600e6 Hz". Throws UnitError.
double parse_frequency(std::string_view text);

}  // namespace stratasim::hw
