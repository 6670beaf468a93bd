#include "cli/fit_command.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include "cli/common.hpp"
#include "hw_models/files.hpp"
#include "study/calibration_set.hpp"
#include "study/catalog.hpp"
#include "study/collective_fit.hpp"
#include "study/errors.hpp"
#include "study/fit.hpp"

namespace stratasim::cli {

namespace fs = std::filesystem;

void add_fit_options(CLI::App* cmd, FitArgs& args) {
  cmd->add_option("--calibration", args.calibration,
                  "Calibration file (default: tests/reference/calibration.json)");
  cmd->add_option("--device", args.devices,
                  "Device to fit (file or name from configs/hardware/devices); repeat for several, "
                  "fitted together (kernel-class parameters are shared)");
  cmd->add_option("--out-dir", args.out_dir, "Folder to write <device>.kernel-model.json into");
  cmd->add_option("--frameworks", args.frameworks,
                  "After the kernel models, fit each training framework's compute efficiency, "
                  "elementwise traffic and attention efficiency, and each GPU die's GEMM and "
                  "attention factors relative to the reference die, to the calibration file's "
                  "end-to-end runs (with the devices' shipped kernel models) and write them to "
                  "this JSON file");
  cmd->add_option("--max-evaluations", args.options.max_evaluations,
                  "Objective evaluations per Nelder-Mead run of a kernel block (default 20000); "
                  "a block that has not converged within them is an error")
      ->check(integer_at_least(1, 100000000));
  cmd->add_option("--max-framework-evaluations", args.options.max_framework_evaluations,
                  "The same for the fit of the frameworks and dies (default 2000; each "
                  "evaluation simulates the end-to-end runs)")
      ->check(integer_at_least(1, 1000000));
  cmd->add_option("--residuals", args.residuals,
                  "Also write every case's measured and fitted time to this CSV file");
  cmd->add_option("--collectives", args.collectives,
                  "Fit the NCCL model's fabrics (and measuring tools) to the calibration file's "
                  "collective sweeps and rewrite their files in this folder "
                  "(configs/hardware/nccl; study/collective_fit.hpp)");
  cmd->add_flag("--quiet", args.quiet, "Print nothing on success");
}

namespace {

int fit_collectives(const std::string& file, const FitArgs& args) {
  std::error_code ec;
  if (!fs::is_directory(args.collectives, ec)) {
    throw study::BadInput("--collectives " + args.collectives + ": not a directory");
  }
  const auto fits = study::fit_collectives(file, args.collectives);
  if (!args.quiet) {
    for (const auto& f : fits) {
      std::printf("%-22s", f.name.c_str());
      for (const auto& [field, value] : f.values) std::printf("  %s %.4g", field.c_str(), value);
      std::printf("  (%d points of %zu cases: mean |error| %.1f%%, max %.1f%%)\n", f.points,
                  f.cases.size(), 100 * f.mean_abs_error, 100 * f.max_abs_error);
    }
    std::cout << "wrote " << args.collectives << "\n";
  }
  return 0;
}

int fit_frameworks(const std::string& file, const FitArgs& args) {
  const auto fit = study::fit_frameworks(file, args.options);
  files::write_atomically(args.frameworks, study::to_json(fit).dump(2) + "\n");
  if (!args.quiet) {
    for (const auto& f : fit.frameworks) {
      std::printf(
          "framework %-8s compute_efficiency %.3f  elementwise_traffic %.2f  "
          "attention_efficiency %.2f  (%zu runs: mean |error| %.1f%%, max %.1f%%)\n",
          f.framework.c_str(), f.compute_efficiency, f.elementwise_traffic, f.attention_efficiency,
          f.cases.size(), 100 * f.mean_abs_error, 100 * f.max_abs_error);
    }
    for (const auto& d : fit.dies) {
      std::printf(
          "die %-8s gemm %.3f  attention %.3f%s  (%zu runs: mean |error| %.1f%%, max %.1f%%)\n",
          d.die.c_str(), d.gemm, d.attention, d.die == fit.reference_die ? " (reference)" : "",
          d.cases.size(), 100 * d.mean_abs_error, 100 * d.max_abs_error);
    }
    std::cout << "wrote " << args.frameworks << "\n";
  }
  return 0;
}

}  // namespace

int fit_command(const FitArgs& args) {
  const std::string file =
      args.calibration.empty() ? study::default_calibration_file().string() : args.calibration;
  if (args.devices.empty() && args.frameworks.empty() && args.collectives.empty()) {
    throw study::BadInput(
        "fit needs --device (kernel models), --frameworks FILE or --collectives DIR");
  }
  if (!args.collectives.empty()) {
    fit_collectives(file, args);
    if (args.devices.empty() && args.frameworks.empty()) return 0;
  }
  if (!args.devices.empty() && args.out_dir.empty()) {
    throw study::BadInput("fit --device needs --out-dir");
  }
  const fs::path out(args.out_dir);
  std::error_code ec;
  if (!args.devices.empty() && !fs::is_directory(out, ec)) {
    throw study::BadInput("--out-dir " + args.out_dir + ": not a directory");
  }
  std::vector<hw::DeviceSpec> devices;
  std::vector<fs::path> files;
  for (const auto& d : args.devices) {
    files.push_back(study::resolve_device(d));
    devices.push_back(study::load_device(d));
  }
  if (args.devices.empty()) return fit_frameworks(file, args);
  const auto doc = study::load_calibration(file);
  const auto cases = study::kernel_cases(doc, file);
  const auto result = study::fit_kernel_models(
      devices, cases,
      "stratasim fit --calibration tests/reference/calibration.json (" +
          std::to_string(cases.size()) + " kernel cases); scripts/fit-profiles",
      args.options);
  if (!args.residuals.empty()) {
    files::write_atomically(args.residuals, [&](std::ostream& csv) {
      csv << "device,case,series,measured_s,fitted_s,error_pct\n";
      for (const auto& r : result.residuals) {
        char line[512];
        std::snprintf(line, sizeof line, "%s,%s,%s,%.6e,%.6e,%.2f\n", r.device.c_str(),
                      r.case_id.c_str(), r.series.c_str(), r.measured_seconds, r.predicted_seconds,
                      100 * r.error());
        csv << line;
      }
    });
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const fs::path target = out / (files[i].stem().string() + ".kernel-model.json");
    hw::write_kernel_model(result.models[i], target);
    if (args.quiet) continue;
    std::cout << devices[i].name << " -> " << target.string() << "\n";
    const auto& m = result.models[i];
    for (const auto& [t, scaling] : hw::kGemmClasses) {
      if (const auto& g = m.gemm_slot(t, scaling)) {
        if (const auto& d = g->deepgemm) {
          std::printf(
              "  gemm %-9s peak_fraction %.3f  memory_fraction %.3f  overlap %.2f  "
              "load_latency %.3g us  tile_latency %.3g us  predicated_promotion %.3f  "
              "latency %.3g us\n",
              hw::KernelModel::gemm_key(t, scaling).c_str(), g->peak_fraction, d->memory_fraction,
              d->overlap, d->load_latency * 1e6, d->tile_latency * 1e6, d->predicated_promotion,
              g->latency * 1e6);
        } else {
          std::printf("  gemm %-9s peak_fraction %.3f  k_overhead %.0f\n",
                      hw::KernelModel::gemm_key(t, scaling).c_str(), g->peak_fraction,
                      g->k_overhead);
        }
      }
    }
    for (hw::AttentionImpl a : hw::kAllAttentionImpls) {
      if (const auto& at = m.attention[static_cast<std::size_t>(a)]) {
        std::printf(
            "  %-18s forward %.3f backward %.3f seq_half %.0f causal_seq_half %.0f "
            "head_dim_64 %.3f head_dim_256 %.3f causal_factor %.3f\n",
            std::string(hw::name_of(a)).c_str(), at->forward, at->backward, at->seq_half,
            at->causal_seq_half, at->head_dim_64, at->head_dim_256, at->causal_factor);
      }
    }
    for (const auto& [block, stats] : m.fit.items()) {
      std::printf("  fit %-28s %3d cases  mean |error| %5.1f%%  max %5.1f%%\n", block.c_str(),
                  stats.at("cases").get<int>(), 100 * stats.at("mean_abs_error").get<double>(),
                  100 * stats.at("max_abs_error").get<double>());
    }
  }
  return args.frameworks.empty() ? 0 : fit_frameworks(file, args);
}

}  // namespace stratasim::cli
