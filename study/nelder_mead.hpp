// Nelder-Mead minimisation, shared by the fits (study/fit.hpp, study/collective_fit.hpp).
#pragma once

#include <functional>
#include <vector>

namespace stratasim::study {

struct Minimum {
  std::vector<double> x;
  double f = 0;
  bool converged = false;
};

/// Nelder-Mead (reflection 1, expansion 2, contraction 1/2, shrink 1/2) from x0 with initial
/// steps of `step`; converged when the simplex's values agree within `tol` (absolute) and its
/// points within 1e-7.
Minimum nelder_mead(const std::function<double(const std::vector<double>&)>& f,
                    std::vector<double> x0, double step, int max_evaluations, double tol);

}  // namespace stratasim::study
